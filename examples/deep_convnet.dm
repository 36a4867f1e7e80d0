# A deep plain convolutional network: 16 identical 3x3 conv + relu blocks at 64 channels.
input  image: [64, 64, 3]
target label: int

logits = image
  |> conv2d(64, 3, activation: relu) as stem
  |> repeat 16 { conv2d(64, 3) |> relu }
  |> global_avgpool
  |> dense(10)

loss cross_entropy(logits, label)
train { batch: 32, optimizer: sgd(lr: 0.01, momentum: 0.9, weight_decay: 5e-4) }
