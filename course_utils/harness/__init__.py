"""What a learner's code may use: no answer lives here, so the grader copies it whole into the
graded kernel (graders/isolation/student_build.py) and stubs everything else. Nothing here imports
course_utils.references (tests/harness/test_student_build.py checks it).

    counting_memory          notebook 04's CountingMemory (HBM + on-chip memory, counted), its
                             errors, and record_loop (a learner's loop run on a fresh memory)
    hardware                 the GPUs' numbers: Hardware, H100_SXM, A100, H200 (measured)
    constants                NEG_INF, LOG2E
    attention_backends       notebook 11's backends by name: resolve_attention, attention_label,
                             naive_attention_torch
    kernel_inputs            the Triton kernels' input checks (forward, decode) and the decode
                             kernel's num_splits and tuning, shared with the skeletons
    ring_comm                notebook 10's ring transport: rank processes, RingComm, the runner,
                             the zig-zag layout and its chunk pairs (SKIP, FULL, CAUSAL)
    ring_guard               what a rank may use, and the proof its attention came from the ring
    triton_puzzles           notebook 06's puzzle launchers and input checks
    triton_learner           notebook 06's runner of a learner's forward kernel
    triton_learner_backward  notebook 08's skeleton: tiles in and out, the learner's backward
    decode_learner           notebook 09's skeleton of the split-KV decode kernel
    triton_bounds            the interpreter's bounds guard on every load and store
    triton_interpreter_speed the interpreter without re-patching per helper call or overflow
                             checks outside debug mode (a GPU build has neither)
    triton_load_log          the loads of each launch, recorded through the bounds guard
    key_parts                notebook 02's key sets (KeyParts) handed to attention_by_parts
    capstone_backend         notebook 11's check_backend, handed to the learner's attention block
"""
