# A small GPT (3.3 M parameters): byte-level tokens, 4 pre-norm transformer blocks of width 256
# with 4 causal attention heads, trained to predict each next byte. Attention is fused: the
# 256 x 256 scores of a head are never held, so the saved activations grow with t, not t^2.
#   dmc run examples/gpt.dm --data examples/data/corpus.txt --steps 900 --save gpt.safetensors
#   dmc sample examples/gpt.dm --init gpt.safetensors --prompt "The plan " --tokens 200
input  tokens: int[256]
target next: int[256]

block transformer(x, width, hidden, heads) {
  h = x + (x |> layernorm |> attention(heads))
  return h + (h |> layernorm |> dense(hidden, activation: gelu) |> dense(width))
}

x = tokens |> embedding(256, 256) |> pos_embedding
h = x |> repeat 4 { transformer(256, 1024, 4) }
logits = h |> layernorm |> dense(256)

loss cross_entropy(logits, next)
train { batch: 8, optimizer: adamw(lr: 2e-3, betas: (0.9, 0.95), weight_decay: 0.01), schedule: cosine(warmup: 30, steps: 900, min_lr: 1e-4), clip_norm: 1.0, seed: 1 }
