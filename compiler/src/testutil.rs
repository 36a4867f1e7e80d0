//! Hand-built checked models for tests (the parser is developed separately): a small builder that
//! computes per-sample shapes and parameter specs as the checker does, and the fixture networks.

use std::collections::HashMap;

use dmc_grammar::model::{
    Activation, DType, Layer, Loss, LossKind, Model, Node, Optimizer, Padding, ParamSpec, Shape,
    Span, TensorDecl, TrainConfig, ValueRef,
};

/// Builds a [`Model`] layer by layer; names layers `<kind>_<k>` (1-based per kind).
#[derive(Debug, Default, Clone)]
pub struct ModelBuilder {
    inputs: Vec<TensorDecl>,
    targets: Vec<TensorDecl>,
    nodes: Vec<Node>,
    counters: HashMap<&'static str, usize>,
}

fn decl(name: &str, shape: &[usize], dtype: DType) -> TensorDecl {
    TensorDecl {
        name: name.into(),
        shape: shape.to_vec(),
        dtype,
        span: Span::default(),
    }
}

impl ModelBuilder {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn input(&mut self, name: &str, shape: &[usize]) -> ValueRef {
        self.inputs.push(decl(name, shape, DType::F32));
        ValueRef::Input(self.inputs.len() - 1)
    }
    pub fn target(&mut self, name: &str, shape: &[usize], dtype: DType) -> ValueRef {
        self.targets.push(decl(name, shape, dtype));
        ValueRef::Target(self.targets.len() - 1)
    }
    pub fn shape(&self, v: ValueRef) -> Shape {
        match v {
            ValueRef::Input(i) => self.inputs[i].shape.clone(),
            ValueRef::Target(i) => self.targets[i].shape.clone(),
            ValueRef::Node(i) => self.nodes[i].shape.clone(),
        }
    }
    fn push(
        &mut self,
        kind: &'static str,
        layer: Layer,
        inputs: Vec<ValueRef>,
        shape: Shape,
        params: Vec<(Shape, usize, usize, bool)>,
    ) -> ValueRef {
        let k = self.counters.entry(kind).or_insert(0);
        *k += 1;
        let name = format!("{kind}_{k}");
        let params = params
            .into_iter()
            .map(|(shape, fan_in, fan_out, is_bias)| ParamSpec {
                name: format!("{name}.{}", if is_bias { "bias" } else { "weight" }),
                shape,
                fan_in,
                fan_out,
                is_bias,
            })
            .collect();
        self.nodes.push(Node {
            name,
            layer,
            inputs,
            shape,
            params,
            span: Span::default(),
        });
        ValueRef::Node(self.nodes.len() - 1)
    }
    pub fn conv(
        &mut self,
        x: ValueRef,
        filters: usize,
        kernel: usize,
        stride: usize,
        padding: Padding,
        bias: bool,
    ) -> ValueRef {
        let s = self.shape(x);
        let out = |i: usize| match padding {
            Padding::Same => i.div_ceil(stride),
            Padding::Valid => (i - kernel) / stride + 1,
        };
        let shape = vec![out(s[0]), out(s[1]), filters];
        let (fi, fo) = (kernel * kernel * s[2], kernel * kernel * filters);
        let mut params = vec![(vec![kernel, kernel, s[2], filters], fi, fo, false)];
        if bias {
            params.push((vec![filters], fi, fo, true));
        }
        self.push(
            "conv2d",
            Layer::Conv2d {
                filters,
                kernel,
                stride,
                padding,
                bias,
            },
            vec![x],
            shape,
            params,
        )
    }
    pub fn dense(&mut self, x: ValueRef, units: usize, bias: bool) -> ValueRef {
        let k = self.shape(x)[0];
        let mut params = vec![(vec![k, units], k, units, false)];
        if bias {
            params.push((vec![units], k, units, true));
        }
        self.push(
            "dense",
            Layer::Dense { units, bias },
            vec![x],
            vec![units],
            params,
        )
    }
    pub fn maxpool(&mut self, x: ValueRef, size: usize, stride: usize) -> ValueRef {
        let s = self.shape(x);
        let shape = vec![(s[0] - size) / stride + 1, (s[1] - size) / stride + 1, s[2]];
        self.push(
            "max_pooling2d",
            Layer::MaxPool { size, stride },
            vec![x],
            shape,
            vec![],
        )
    }
    pub fn avgpool(&mut self, x: ValueRef, size: usize, stride: usize) -> ValueRef {
        let s = self.shape(x);
        let shape = vec![(s[0] - size) / stride + 1, (s[1] - size) / stride + 1, s[2]];
        self.push(
            "average_pooling2d",
            Layer::AvgPool { size, stride },
            vec![x],
            shape,
            vec![],
        )
    }
    pub fn gap(&mut self, x: ValueRef) -> ValueRef {
        let c = self.shape(x)[2];
        self.push(
            "global_average_pooling2d",
            Layer::GlobalAvgPool,
            vec![x],
            vec![c],
            vec![],
        )
    }
    pub fn flatten(&mut self, x: ValueRef) -> ValueRef {
        let n = self.shape(x).iter().product();
        self.push("flatten", Layer::Flatten, vec![x], vec![n], vec![])
    }
    pub fn act(&mut self, x: ValueRef, a: Activation) -> ValueRef {
        let s = self.shape(x);
        self.push("activation", Layer::Act(a), vec![x], s, vec![])
    }
    pub fn add(&mut self, a: ValueRef, b: ValueRef) -> ValueRef {
        let s = self.shape(a);
        self.push("add", Layer::Add, vec![a, b], s, vec![])
    }
    pub fn dropout(&mut self, x: ValueRef, p: f32) -> ValueRef {
        let s = self.shape(x);
        self.push("dropout", Layer::Dropout { p }, vec![x], s, vec![])
    }
    pub fn build(
        self,
        pred: ValueRef,
        kind: LossKind,
        target: ValueRef,
        batch: usize,
        optimizer: Optimizer,
    ) -> Model {
        Model {
            inputs: self.inputs,
            targets: self.targets,
            nodes: self.nodes,
            output: pred,
            loss: Loss {
                kind,
                pred,
                target,
                span: Span::default(),
            },
            train: TrainConfig {
                batch,
                optimizer,
                epochs: None,
                seed: None,
            },
        }
    }
}

pub fn sgd(lr: f32) -> Optimizer {
    Optimizer::Sgd {
        lr,
        momentum: 0.0,
        weight_decay: 0.0,
        nesterov: false,
    }
}
pub fn sgd_momentum(lr: f32, momentum: f32) -> Optimizer {
    Optimizer::Sgd {
        lr,
        momentum,
        weight_decay: 0.0,
        nesterov: false,
    }
}
pub fn adam(lr: f32) -> Optimizer {
    Optimizer::Adam {
        lr,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-7,
        weight_decay: 0.0,
        decoupled: false,
    }
}

/// Dense chain: dense+relu, dropout, dense+tanh, dense (no bias)+sigmoid; MSE.
pub fn mlp(opt: Optimizer) -> Model {
    let mut b = ModelBuilder::new();
    let x = b.input("x", &[8]);
    let y = b.target("y", &[3], DType::F32);
    let h = b.dense(x, 16, true);
    let h = b.act(h, Activation::Relu);
    let h = b.dropout(h, 0.25);
    let h = b.dense(h, 8, true);
    let h = b.act(h, Activation::Tanh);
    let h = b.dense(h, 3, false);
    let out = b.act(h, Activation::Sigmoid);
    b.build(out, LossKind::Mse, y, 4, opt)
}

/// Small conv net: conv(same, stride 2)+relu, maxpool, conv(valid, no bias)+gelu, avgpool,
/// flatten, dense; cross-entropy with `[]` labels.
pub fn convnet(opt: Optimizer) -> Model {
    let mut b = ModelBuilder::new();
    let x = b.input("image", &[12, 12, 3]);
    let y = b.target("label", &[], DType::I32);
    let h = b.conv(x, 4, 3, 2, Padding::Same, true); // 6x6x4
    let h = b.act(h, Activation::Relu);
    let h = b.maxpool(h, 2, 2); // 3x3x4
    let h = b.conv(h, 8, 2, 1, Padding::Valid, false); // 2x2x8
    let h = b.act(h, Activation::Gelu);
    let h = b.avgpool(h, 2, 1); // 1x1x8
    let h = b.flatten(h);
    let out = b.dense(h, 5, true);
    b.build(out, LossKind::CrossEntropy, y, 2, opt)
}

/// Residual DAG: conv+relu (a), conv(same, k=2: asymmetric padding), add(a, .), relu,
/// global average pool, dense; cross-entropy with `[1]` labels.
pub fn residual(opt: Optimizer) -> Model {
    let mut b = ModelBuilder::new();
    let x = b.input("x", &[6, 6, 2]);
    let y = b.target("y", &[1], DType::I32);
    let a = b.conv(x, 4, 3, 1, Padding::Same, true);
    let a = b.act(a, Activation::Relu);
    let h = b.conv(a, 4, 2, 1, Padding::Same, true);
    let h = b.add(a, h);
    let h = b.act(h, Activation::Relu);
    let h = b.gap(h);
    let out = b.dense(h, 3, true);
    b.build(out, LossKind::CrossEntropy, y, 3, opt)
}

/// The "seed" network: 16x16x1 -> conv 256, pool, conv 512, pool, 22 x conv 1024, pool,
/// conv 256, conv 32, pool, flatten, dense 4, dense 1; MSE; batch 1; SGD lr 0.01.
pub fn seed() -> Model {
    let mut b = ModelBuilder::new();
    let x = b.input("x", &[16, 16, 1]);
    let y = b.target("y", &[1], DType::F32);
    let mut h = b.conv(x, 256, 3, 1, Padding::Same, true);
    h = b.maxpool(h, 2, 2);
    h = b.conv(h, 512, 3, 1, Padding::Same, true);
    h = b.maxpool(h, 2, 2);
    for _ in 0..22 {
        h = b.conv(h, 1024, 3, 1, Padding::Same, true);
    }
    h = b.maxpool(h, 2, 2);
    h = b.conv(h, 256, 3, 1, Padding::Same, true);
    h = b.conv(h, 32, 3, 1, Padding::Same, true);
    h = b.maxpool(h, 2, 2);
    h = b.flatten(h);
    h = b.dense(h, 4, true);
    let out = b.dense(h, 1, true);
    b.build(out, LossKind::Mse, y, 1, sgd(0.01))
}

/// The small fixtures (all but the seed network), by name, with the given optimizer.
pub fn small_fixtures(opt: Optimizer) -> Vec<(&'static str, Model)> {
    vec![
        ("mlp", mlp(opt)),
        ("convnet", convnet(opt)),
        ("residual", residual(opt)),
    ]
}

pub use dmc_grammar::model::Model as TestModel;

/// One layer of a random network ([`random_net`]); property tests draw these.
#[derive(Debug, Clone)]
pub enum RandLayer {
    Conv {
        filters: usize,
        k: usize,
        stride: usize,
        same: bool,
        bias: bool,
    },
    Pool {
        max: bool,
        size: usize,
        stride: usize,
    },
    Act(u8),
    Dropout,
    /// `h + conv3x3(h)` (a value used twice: its gradients are summed).
    Residual,
    /// `f(h) + g(h)` with two activations (two elementwise readers of one value).
    Branch(u8, u8),
}

/// The activation numbered `i` (mod 4).
pub fn act_of(i: u8) -> Activation {
    [
        Activation::Relu,
        Activation::Tanh,
        Activation::Sigmoid,
        Activation::Gelu,
    ][i as usize % 4]
}

/// A random network: input `[hw, hw, 2]`, the `layers` (skipping those that do not fit), flatten,
/// the dense layers `(units, bias, activation < 4)`, and a cross-entropy (`ce`) or MSE loss.
/// `opt`: 0 SGD, 1 SGD momentum, 2 Nesterov, 3 Adam, 4 AdamW (with weight decay).
pub fn random_net(
    hw: usize,
    layers: &[RandLayer],
    dense: &[(usize, bool, u8)],
    batch: usize,
    ce: bool,
    opt: u8,
) -> Model {
    let optimizer = match opt % 5 {
        0 => sgd(0.1),
        1 => sgd_momentum(0.1, 0.9),
        2 => Optimizer::Sgd {
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 1e-3,
            nesterov: true,
        },
        3 => adam(1e-3),
        _ => Optimizer::Adam {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-7,
            weight_decay: 1e-2,
            decoupled: true,
        },
    };
    let mut b = ModelBuilder::new();
    let x = b.input("x", &[hw, hw, 2]);
    let mut h = x;
    for l in layers {
        let s = b.shape(h);
        h = match *l {
            RandLayer::Conv {
                filters,
                k,
                stride,
                same,
                bias,
            } => {
                if !same && s[0] < k {
                    continue;
                }
                let pad = if same { Padding::Same } else { Padding::Valid };
                b.conv(h, filters, k, stride, pad, bias)
            }
            RandLayer::Pool { max, size, stride } => {
                if s[0] < size {
                    continue;
                }
                if max {
                    b.maxpool(h, size, stride)
                } else {
                    b.avgpool(h, size, stride)
                }
            }
            RandLayer::Act(a) => b.act(h, act_of(a)),
            RandLayer::Dropout => b.dropout(h, 0.3),
            RandLayer::Residual => {
                let c = b.conv(h, s[2], 3, 1, Padding::Same, true);
                b.add(h, c)
            }
            RandLayer::Branch(f, g) => {
                let l = b.act(h, act_of(f));
                let r = b.act(h, act_of(g));
                b.add(l, r)
            }
        };
    }
    h = b.flatten(h);
    for (units, bias, a) in dense {
        h = b.dense(h, *units, *bias);
        if *a < 4 {
            h = b.act(h, act_of(*a));
        }
    }
    let classes = b.shape(h)[0];
    if ce {
        let y = b.target("y", &[], DType::I32);
        b.build(h, LossKind::CrossEntropy, y, batch, optimizer)
    } else {
        let y = b.target("y", &[classes], DType::F32);
        b.build(h, LossKind::Mse, y, batch, optimizer)
    }
}
