# A multilayer perceptron for MNIST-sized inputs (28x28 images, flattened).
input  image: [784]
target label: int          # class index 0..9

logits = image
  |> dense(256, activation: relu) as hidden1
  |> dense(128, activation: relu) as hidden2
  |> dense(10) as classifier

loss cross_entropy(logits, label)
train {
  batch: 64
  optimizer: sgd(lr: 0.01, momentum: 0.9)
  epochs: 10
  seed: 1
}
