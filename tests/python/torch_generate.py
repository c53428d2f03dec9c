#!/usr/bin/python3
"""Greedy generation with PyTorch, the oracle of tests/parity/torch_generate_test.cpp.

  torch_generate.py --weights MODEL.safetensors --n-head H --prompt 1,2,3 --max-new-tokens N

MODEL holds a GPT with the Hugging Face GPT-2 names (models.py); the configuration is read
off the shapes. Each step runs the model on the last block_size tokens (the window slides
past block_size, as nanoGPT's generate does) and appends the argmax of the last position's
logits (torch.argmax: the first index on ties). Prints the whole sequence (prompt first) as
comma-separated ids on one line, then "min_margin X": the smallest gap between the best and
the second-best logit over the steps, so a caller can tell a real mismatch from a near-tie.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
import safetensors_np as st  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--n-head", type=int, required=True)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--max-new-tokens", type=int, required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    state = {k[len("transformer."):] if k.startswith("transformer.") else k: v
             for k, v in st.load(a.weights).items()}
    V, C = state["wte.weight"].shape
    T = state["wpe.weight"].shape[0]
    L = sum(1 for k in state if k.endswith(".ln_1.weight"))
    cfg = models.GPTConfig(n_layer=L, n_head=a.n_head, n_embd=C, block_size=T, vocab_size=V)
    model = models.GPT(cfg)
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    model.eval()
    ids = [int(x) for x in a.prompt.split(",")]
    margin = float("inf")
    with torch.no_grad():
        for _ in range(a.max_new_tokens):
            window = torch.tensor([ids[-T:]], dtype=torch.long)
            logits, _ = model(window)
            last = logits[0, -1]
            top2 = torch.topk(last, 2).values
            margin = min(margin, float(top2[0] - top2[1]))
            ids.append(int(torch.argmax(last)))
    print(",".join(str(i) for i in ids))
    print(f"min_margin {margin:.6g}")


if __name__ == "__main__":
    main()
