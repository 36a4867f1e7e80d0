# ResNet-18 as torchvision defines it (He et al. 2015; `torchvision.models.resnet18(num_classes=10)`),
# at CIFAR size: a 7x7 stride-2 stem convolution with padding 3, batch normalisation, a 3x3 stride-2
# max-pool with padding 1, four stages of two basic blocks (64, 128, 256, 512 channels; the first
# block of stages 2-4 halves the map with a 3x3 stride-2 convolution and a 1x1 stride-2 projection
# of the skip), a global average pool and a classifier. 11.2 million parameters. Convolutions before
# a batchnorm have no bias, as in torchvision; PyTorch's batchnorm momentum 0.1 and eps 1e-5.
# SGD at lr 0.005: the CIFAR recipe of torchvision's references (0.1 at batch 128), scaled to batch 8.
input  image: [32, 32, 3]
target label: int

# A basic block that keeps the shape: two 3x3 convolutions and the identity skip.
block basic(x, c) {
  y = x |> conv2d(c, 3, padding: 1, bias: false) as conv1 |> batchnorm as bn1 |> relu
        |> conv2d(c, 3, padding: 1, bias: false) as conv2 |> batchnorm as bn2
  return relu(x + y)
}

# A basic block that halves the map and changes the channels: the skip is projected by a 1x1
# stride-2 convolution and a batchnorm (torchvision's `downsample`).
block down(x, c) {
  y = x |> conv2d(c, 3, stride: 2, padding: 1, bias: false) as conv1 |> batchnorm as bn1 |> relu
        |> conv2d(c, 3, padding: 1, bias: false) as conv2 |> batchnorm as bn2
  s = x |> conv2d(c, 1, stride: 2, padding: 0, bias: false) as proj |> batchnorm as proj_bn
  return relu(s + y)
}

logits = image
  |> conv2d(64, 7, stride: 2, padding: 3, bias: false) as conv1 |> batchnorm as bn1 |> relu
  |> maxpool(3, stride: 2, padding: 1)
  |> basic(64) as layer1_0 |> basic(64) as layer1_1
  |> down(128) as layer2_0 |> basic(128) as layer2_1
  |> down(256) as layer3_0 |> basic(256) as layer3_1
  |> down(512) as layer4_0 |> basic(512) as layer4_1
  |> global_avgpool
  |> dense(10) as fc

loss cross_entropy(logits, label)
train { batch: 8, optimizer: sgd(lr: 0.005, momentum: 0.9, weight_decay: 5e-4), seed: 18 }
