"""Autograding for the course: nbgrader configuration, release, grading (python -m graders)."""
