# Shared by the bench scripts (source it): helpers that are the same for every benchmark.

# bench_python MODULE...: prints the first Python that imports every MODULE: Debian's
# /usr/bin/python3 (python3-torch, python3-numpy) first, then python3 on PATH (a GPU machine's
# image often keeps torch in a virtual environment there); nothing when none does.
bench_python() {
  local py modules
  modules=$(IFS=,; echo "$*")  # import a,b
  for py in /usr/bin/python3 "$(command -v python3)"; do
    if [ -x "$py" ] && "$py" -c "import $modules" 2> /dev/null; then
      echo "$py"
      return
    fi
  done
}

# bench_token_file WORKDIR: prints the path of a gpt-mini token file: the WordNet corpus when
# `make demo` prepared it, else 600k random tokens (vocab 4096) written into WORKDIR.
bench_token_file() {
  local root data
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  data="$root/demo-out/data/train.bin"
  if [ -f "$data" ]; then
    echo "$data"
    return
  fi
  data="$1/tokens.bin"
  "$(bench_python numpy)" - "$data" <<'PY'
import sys, numpy as np
n = 600_000
hdr = np.zeros(256, dtype='<i4'); hdr[0] = 20240520; hdr[1] = 1; hdr[2] = n
toks = np.random.default_rng(0).integers(0, 4096, n, dtype=np.uint16)
with open(sys.argv[1], 'wb') as f: f.write(hdr.tobytes()); f.write(toks.astype('<u2').tobytes())
PY
  echo "$data"
}
