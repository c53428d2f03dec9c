#!/bin/sh
# Run a command with PyTorch at its best on this machine (issue 2, "Speed"):
#   - OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset, so OpenBLAS picks its own
#     (AVX-512) kernels and cache blocking for this CPU;
#   - GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296,
#     so glibc malloc stops returning memory to the OS (and re-faulting it) every step.
# The settings apply to that command alone.
#
# Usage:  bench/torch_env.sh CMD [ARGS...]    e.g.
#         bench/torch_env.sh /usr/bin/python3 bench/torch_gpt_train.py --threads 2
#         bench/torch_env.sh                  (no command: print the settings)
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296
export GLIBC_TUNABLES
if [ $# -eq 0 ]; then
    echo "unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE"
    echo "export GLIBC_TUNABLES=$GLIBC_TUNABLES"
    exit 0
fi
echo "torch_env: OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE unset; GLIBC_TUNABLES=$GLIBC_TUNABLES" >&2
exec "$@"
