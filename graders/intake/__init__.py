"""What arrives: submissions found in a folder or an LMS download, read and repaired for grading."""
