# A small CNN with batch normalisation (PyTorch's momentum 0.1, eps 1e-5). The layers before a
# batchnorm have no bias: its mean subtraction cancels one (its gradient would be 0).
input  image: [12, 12, 3]
target label: int

logits = image
  |> conv2d(8, 3, bias: false) |> batchnorm |> relu
  |> maxpool(2)
  |> conv2d(16, 3, bias: false) |> batchnorm(momentum: 0.1, eps: 1e-5) |> relu
  |> global_avgpool
  |> dense(16, bias: false) |> batchnorm |> relu
  |> dense(10)

loss cross_entropy(logits, label)
train { batch: 8, optimizer: sgd(lr: 0.05, momentum: 0.9), seed: 7 }
