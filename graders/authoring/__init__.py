"""Writing the course: instructor notebooks' nbgrader metadata, the setup cell, the course's
layout and nbgrader config (the lowest layer: imports nothing else of graders)."""
