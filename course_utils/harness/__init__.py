"""What a learner's code may use: no answer lives here, so the grader copies it whole into the
graded kernel (graders/isolation/student_build.py) and stubs everything else.

    ring_comm                notebook 10's ring transport: rank processes, RingComm, the runner
    ring_guard               what a rank may use, and the proof its attention came from the ring
    triton_puzzles           notebook 06's puzzle launchers and input checks
    triton_learner           notebook 06's runner of a learner's forward kernel
    triton_learner_backward  notebook 08's skeleton: tiles in and out, the learner's backward
    decode_learner           notebook 09's skeleton of the split-KV decode kernel
    triton_bounds            the interpreter's bounds guard on every load and store
    triton_load_log          the loads of each launch, recorded through the bounds guard
    key_parts                notebook 02's key sets (KeyParts) handed to attention_by_parts
    capstone_backend         notebook 11's check_backend, handed to the learner's attention block
"""
