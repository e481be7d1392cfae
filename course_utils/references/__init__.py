"""The answers: every function here computes what an exercise asks for, or what a figure draws
(the graded kernel sees each one as a stub that raises ReferenceUnavailable).

    softmax         online softmax statistics, one set's softmax, the logsumexp merge (01, 02)
    attention       naive attention (the oracle), tiled FlashAttention forward, split-KV (03, 05)
    tiles           the score tiles a pass computes (skip / mask / full), their order and the HBM
                    elements each step moves (03, 07; the tile-grid figures)
    memory          HBM traffic formulas and counted runs of the attention algorithms (04)
    roofline        FLOPs, arithmetic intensity, time lower bounds (04)
    tile_budget     which tiles fit on chip (03, 06, 08)
    sm_fill         the SM-fill model of split-KV decoding: blocks, busy SMs, waves, time (05)
    backward        the attention backward pass, naive and tiled (07)
    ring_attention  ring attention: the plan, zigzag layout and the rank's loop (10)
    gpt             the capstone's GPT block with a pluggable attention backend (11)
"""
