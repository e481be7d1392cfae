"""Autograding for the course: nbgrader configuration, release, grading (python -m graders).

In layers, lowest first; a module imports only from its own layer or lower ones
(tests/graders/test_layers.py holds every module to it):

    authoring/   the course's layout, nbgrader config and the instructor notebooks' metadata
    isolation/   sandbox, control groups, stripped course package, verdicts outside the kernel
    intake/      submissions in a folder or an LMS download, read and repaired
    run/         nbgrader plumbing, the surviving Execute step, the worker, template and cluster
    outputs/     grades CSVs, feedback, report, gradebook, LMS exports, similarity
    grade.py, __main__.py   the grading command, which ties the layers together
"""
