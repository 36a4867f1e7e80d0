# The network from the question (a Keras Sequential model): 206,538,153 parameters.
# Keras defaults: 3x3 kernels with padding 'same', biases, no activations.
input  x: [16, 16, 1]
target y: [1]

out = x |> conv2d(256, 3) |> maxpool(2)
        |> conv2d(512, 3) |> maxpool(2)
        |> repeat 22 { conv2d(1024, 3) }
        |> maxpool(2)
        |> conv2d(256, 3) |> conv2d(32, 3) |> maxpool(2)
        |> flatten |> dense(4) |> dense(1)

loss mse(out, y)
train { batch: 1, optimizer: sgd(lr: 0.01) }
