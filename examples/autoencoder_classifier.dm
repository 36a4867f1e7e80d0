# A convolutional autoencoder with a classifier head on its code, trained on a weighted sum of
# losses (Keras' `loss_weights`, PyTorch's `0.5 * mse + ce`): the reconstruction's mean squared
# error at half weight plus the classifier's cross-entropy.
input  x: [16, 16, 3]
target image: [16, 16, 3]      # the reconstruction's target (`--data` gives the images again)
target label: int

code = x |> conv2d(16, 3, stride: 2, padding: 1, activation: relu)
         |> conv2d(32, 3, stride: 2, padding: 1, activation: relu)
recon = code |> upsample(2) |> conv2d(16, 3, activation: relu)
             |> upsample(2) |> conv2d(3, 3)
logits = code |> global_avgpool |> dense(10)

loss 0.5 * mse(recon, image) + cross_entropy(logits, label)
train { batch: 8, optimizer: adam(lr: 0.003), epochs: 2 }
