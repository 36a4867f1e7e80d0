# A MobileNet-style network (Howard et al. 2017, MobileNet v1 at width 0.25, CIFAR size): a 3x3
# stride-2 stem, then depthwise-separable blocks, each a 3x3 depthwise convolution (`groups` = its
# channels) and a 1x1 pointwise convolution, both followed by batchnorm and ReLU (v1 used ReLU6);
# the stride-2 blocks halve the map. PyTorch: `Conv2d(c, c, 3, stride=s, padding=1, groups=c)` then
# `Conv2d(c, f, 1)`; Keras: `DepthwiseConv2D(3)` then `Conv2D(f, 1)`.
input  image: [32, 32, 3]
target label: int

# One depthwise-separable block: c channels in, f out, stride s.
block separable(x, c, f, s) {
  return x
    |> conv2d(c, 3, stride: s, padding: 1, groups: c, bias: false) as dw |> batchnorm as dw_bn |> relu
    |> conv2d(f, 1, padding: 0, bias: false) as pw |> batchnorm as pw_bn |> relu
}

logits = image
  |> conv2d(16, 3, stride: 2, padding: 1, bias: false) as stem |> batchnorm as stem_bn |> relu
  |> separable(16, 32, 1)
  |> separable(32, 64, 2)
  |> separable(64, 64, 1)
  |> separable(64, 128, 2)
  |> separable(128, 128, 1)
  |> separable(128, 256, 2)
  |> separable(256, 256, 1)
  |> separable(256, 256, 1)
  |> global_avgpool
  |> dense(10) as classifier

loss cross_entropy(logits, label)
train { batch: 16, optimizer: adam(lr: 1e-3), seed: 21 }
