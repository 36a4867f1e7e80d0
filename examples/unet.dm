# A small UNet (Ronneberger et al. 2015) for per-pixel regression at 32x32: two encoder stages
# (two 3x3 convolutions with batchnorm and ReLU, then a 2x2 max-pool), a bottleneck, and two decoder
# stages that upsample with a 2x2 stride-2 transposed convolution and concatenate the encoder's
# features of the same size along the channels (PyTorch `torch.cat([up, skip], dim=1)`, Keras
# `Concatenate()`), then a 1x1 convolution to one output channel.
input  image: [32, 32, 3]
target mask: [32, 32, 1]

# Two 3x3 convolutions, each with batchnorm and ReLU (PyTorch `padding=1`).
block double_conv(x, c) {
  return x
    |> conv2d(c, 3, padding: 1, bias: false) as conv1 |> batchnorm as bn1 |> relu
    |> conv2d(c, 3, padding: 1, bias: false) as conv2 |> batchnorm as bn2 |> relu
}

e1 = image |> double_conv(16) as enc1
e2 = e1 |> maxpool(2) |> double_conv(32) as enc2
b  = e2 |> maxpool(2) |> double_conv(64) as bottleneck
u2 = b |> conv_transpose2d(32, 2, stride: 2) as up2
d2 = concat(u2, e2) |> double_conv(32) as dec2
u1 = d2 |> conv_transpose2d(16, 2, stride: 2) as up1
d1 = concat(u1, e1) |> double_conv(16) as dec1
out = d1 |> conv2d(1, 1) as head

loss mse(out, mask)
train { batch: 4, optimizer: adam(lr: 1e-3), seed: 5 }
