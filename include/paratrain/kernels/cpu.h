// paratrain CPU kernels: the whole API in one include.
//
// Free functions in namespace paratrain::kernels::cpu over raw pointers, llm.c style: every
// function carries a shape legend such as `// inp (N,C), weight (C), out (N,C)`. Unless a
// comment says otherwise, arrays are row-major, contiguous, f32, and sizes are element counts.
//
// Conventions that hold for every header below:
//  - Forward functions and plain ops OVERWRITE their outputs (out = ...).
//  - Backward functions ACCUMULATE (+=) into every gradient they produce: parameter
//    gradients (dweight, dbias, dwte, ...) and input gradients (dinp, dqkv, ...). Zero the
//    gradient buffers before the first backward. The few exceptions say so by name or in
//    their comment (crossentropy_backward writes dlogits with `=`).
//  - bf16/f16 arrays are uint16_t bit patterns (paratrain/tensor/dtype.h).
//  - Kernels are multi-threaded with OpenMP (one pool, shared with oneDNN) and run
//    single-threaded when called from inside a parallel region. set_num_threads() in
//    threads.h sets the count.
//  - No kernel allocates per call in steady state: scratch comes from the caller or from a
//    grow-only thread-local buffer that is reused.
//  - Aliasing: elementwise ops allow out == an input; other kernels require distinct arrays
//    unless stated.
//  - Bad arguments (negative sizes, token ids out of range) throw paratrain::InputError;
//    null pointers are allowed only where a comment says so (and for zero sizes).
#pragma once

#include "paratrain/kernels/cpu/threads.h"
#include "paratrain/kernels/cpu/gemm.h"
#include "paratrain/kernels/cpu/linear.h"
#include "paratrain/kernels/cpu/elementwise.h"
#include "paratrain/kernels/cpu/reduce.h"
#include "paratrain/kernels/cpu/reduce_into.h"
#include "paratrain/kernels/cpu/layernorm.h"
#include "paratrain/kernels/cpu/softmax.h"
#include "paratrain/kernels/cpu/vocab_shard_ce.h"
#include "paratrain/kernels/cpu/attention.h"
#include "paratrain/kernels/cpu/attention_parts.h"
#include "paratrain/kernels/cpu/embedding.h"
#include "paratrain/kernels/cpu/conv.h"
#include "paratrain/kernels/cpu/optim.h"
#include "paratrain/kernels/cpu/orthogonalize.h"
#include "paratrain/kernels/cpu/peak.h"
#include "paratrain/kernels/cpu/half.h"
