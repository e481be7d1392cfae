"""What the grader writes from the results: grades CSVs, feedback, the class report, the
nbgrader gradebook, LMS exports, similar answers, the misconceptions' words."""
