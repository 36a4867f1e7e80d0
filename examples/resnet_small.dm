# A small residual network: a stem convolution, three residual blocks, a classifier.
input  image: [16, 16, 3]
target label: int

# Two 3x3 convolutions with a skip connection; `x` is the piped-in value.
block res(x, c) {
  y = x |> conv2d(c, 3, activation: relu) |> conv2d(c, 3)
  return relu(x + y)
}

h = image |> conv2d(16, 3, activation: relu) as stem
logits = h
  |> res(16) |> res(16) |> res(16)
  |> global_avgpool
  |> dense(10)

loss cross_entropy(logits, label)
train { batch: 8, optimizer: adam(lr: 1e-3), seed: 42 }
