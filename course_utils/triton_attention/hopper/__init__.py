"""The Hopper (sm_90) kernels: warp-specialized FlashAttention in Gluon, FlashAttention-3's design.

    forward_ws          flash_attention_fwd_ws: a TMA loader warp and two softmax warpgroups
                        (wgmma), persistent programs; `supported`, `preferred`, `launch_policy`,
                        `compile_for_sm90`
    backward_ws         flash_attention_bwd_ws: the three gradients in one pass, dQ added by TMA
                        reduce-adds; its options and measured defaults, `preferred`,
                        `compile_for_sm90` (the device code is backward_ws_kernel)

They run on Hopper only and take fewer shapes than the teaching kernels (float16 or bfloat16,
d 64 or 128, contiguous, lengths multiples of 128: `forward_ws.supported`). They import the
teaching kernels' helpers (input checks, the backward's preprocess kernel), never the other way
round: the one place that chooses them is `course_utils.triton_attention.autograd.pick_kernel`.

This package imports nothing itself: importing a module of it needs Triton's Gluon API (Triton
3.6 or newer, as `forward_ws.MIN_TRITON` says); the autograd function imports it lazily and keeps
the teaching kernels where it cannot.
"""
