//! Test fixtures: checked models built from `.dm` text by the real front end
//! ([`dmc_grammar::compile_source`]), so that no test relies on a second implementation of the
//! shape rules. Every layer is named with `as` in the style `<kind>_<k>` (`conv2d_1`,
//! `activation_2`, `max_pooling2d_1`, ...), the names tests, snapshots and weight seeds refer to.

use std::collections::HashMap;

use dmc_grammar::model::{Activation, Model, Optimizer};
use dmc_grammar::Kind;

pub use dmc_grammar::model::Model as TestModel;

/// The checked model of `src`; panics with the diagnostic when the checker rejects it (a broken
/// fixture, not a test failure of the compiler).
pub fn checked(src: &str) -> Model {
    match dmc_grammar::compile_source(src, "fixture.dm") {
        Ok(m) => m,
        Err(d) => panic!(
            "fixture rejected at {}:{}: {}\n{src}",
            d.line, d.col, d.message
        ),
    }
}

/// `opt` as the value of the `optimizer:` setting of a `train` section.
pub fn optimizer_dm(opt: &Optimizer) -> String {
    match *opt {
        Optimizer::Sgd {
            lr,
            momentum,
            weight_decay,
            nesterov,
            ..
        } => format!(
            "sgd(lr: {lr:?}, momentum: {momentum:?}, weight_decay: {weight_decay:?}, \
             nesterov: {nesterov})"
        ),
        Optimizer::Adam {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            decoupled,
            ..
        } => format!(
            "{}(lr: {lr:?}, beta1: {beta1:?}, beta2: {beta2:?}, eps: {eps:?}, \
             weight_decay: {weight_decay:?})",
            if decoupled { "adamw" } else { "adam" }
        ),
        Optimizer::RmsProp {
            lr,
            alpha,
            eps,
            weight_decay,
            momentum,
            ..
        } => format!(
            "rmsprop(lr: {lr:?}, alpha: {alpha:?}, eps: {eps:?}, weight_decay: {weight_decay:?}, \
             momentum: {momentum:?})"
        ),
        Optimizer::Lion {
            lr,
            beta1,
            beta2,
            weight_decay,
            ..
        } => format!(
            "lion(lr: {lr:?}, beta1: {beta1:?}, beta2: {beta2:?}, weight_decay: {weight_decay:?})"
        ),
    }
}

/// [`checked`] with a `train` section of `batch` and `opt` appended; the optimizer must come back
/// exactly (every `f32` the fixtures use round-trips through its text).
pub fn checked_with(src: &str, batch: usize, opt: &Optimizer) -> Model {
    let src = format!(
        "{src}train {{ batch: {batch}, optimizer: {} }}\n",
        optimizer_dm(opt)
    );
    let m = checked(&src);
    assert_eq!(
        m.train.optimizer, *opt,
        "the optimizer does not round-trip:\n{src}"
    );
    m
}

pub fn sgd(lr: f32) -> Optimizer {
    Optimizer::Sgd {
        lr,
        momentum: 0.0,
        weight_decay: 0.0,
        nesterov: false,
        clip_value: None,
        clip_norm: None,
    }
}
pub fn sgd_momentum(lr: f32, momentum: f32) -> Optimizer {
    Optimizer::Sgd {
        lr,
        momentum,
        weight_decay: 0.0,
        nesterov: false,
        clip_value: None,
        clip_norm: None,
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
        clip_value: None,
        clip_norm: None,
    }
}

/// Dense chain: dense+relu, dropout, dense+tanh, dense (no bias)+sigmoid; MSE; batch 4.
pub fn mlp(opt: Optimizer) -> Model {
    let src = "input x: [8]
target y: [3]
out = x
  |> dense(16) as dense_1
  |> relu as activation_1
  |> dropout(0.25) as dropout_1
  |> dense(8) as dense_2
  |> tanh as activation_2
  |> dense(3, bias: false) as dense_3
  |> sigmoid as activation_3
loss mse(out, y)
";
    checked_with(src, 4, &opt)
}

/// Small conv net: conv(same, stride 2)+relu, maxpool, conv(valid, no bias)+gelu, avgpool,
/// flatten, dense; cross-entropy with `[]` labels; batch 2.
pub fn convnet(opt: Optimizer) -> Model {
    let src = "input image: [12, 12, 3]
target label: int
out = image
  |> conv2d(4, 3, stride: 2, padding: same) as conv2d_1
  |> relu as activation_1
  |> maxpool(2, stride: 2) as max_pooling2d_1
  |> conv2d(8, 2, padding: valid, bias: false) as conv2d_2
  |> gelu as activation_2
  |> avgpool(2, stride: 1) as average_pooling2d_1
  |> flatten as flatten_1
  |> dense(5) as dense_1
loss cross_entropy(out, label)
";
    checked_with(src, 2, &opt)
}

/// Residual DAG: conv+relu (a), conv(same, k=2: asymmetric padding), add(a, .), relu,
/// global average pool, dense; cross-entropy with `[1]` labels; batch 3.
pub fn residual(opt: Optimizer) -> Model {
    let src = "input x: [6, 6, 2]
target y: int [1]
a = x |> conv2d(4, 3) as conv2d_1 |> relu as activation_1
h = a |> conv2d(4, 2) as conv2d_2
s = a + h
out = s
  |> relu as activation_2
  |> global_avgpool as global_average_pooling2d_1
  |> dense(3) as dense_1
loss cross_entropy(out, y)
";
    checked_with(src, 3, &opt)
}

/// The "seed" network: 16x16x1 -> conv 256, pool, conv 512, pool, 22 x conv 1024, pool,
/// conv 256, conv 32, pool, flatten, dense 4, dense 1; MSE; batch 1; SGD lr 0.01.
pub fn seed() -> Model {
    let mut convs = 0;
    let mut conv = |filters: usize| {
        convs += 1;
        format!("  |> conv2d({filters}, 3) as conv2d_{convs}\n")
    };
    let mut src = String::from("input x: [16, 16, 1]\ntarget y: [1]\nout = x\n");
    src += &conv(256);
    src += "  |> maxpool(2) as max_pooling2d_1\n";
    src += &conv(512);
    src += "  |> maxpool(2) as max_pooling2d_2\n";
    for _ in 0..22 {
        src += &conv(1024);
    }
    src += "  |> maxpool(2) as max_pooling2d_3\n";
    src += &conv(256);
    src += &conv(32);
    src += "  |> maxpool(2) as max_pooling2d_4\n";
    src += "  |> flatten as flatten_1\n  |> dense(4) as dense_1\n  |> dense(1) as dense_2\n";
    src += "loss mse(out, y)\n";
    checked_with(&src, 1, &sgd(0.01))
}

/// The small fixtures (all but the seed network), by name, with the given optimizer.
pub fn small_fixtures(opt: Optimizer) -> Vec<(&'static str, Model)> {
    vec![
        ("mlp", mlp(opt)),
        ("convnet", convnet(opt)),
        ("residual", residual(opt)),
    ]
}

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

/// A random network being written as `.dm` statements `hK = ...`, one layer (or add) each.
struct RandNet {
    hw: usize,
    lines: Vec<String>,
    /// The value the next layer reads.
    cur: String,
    /// Layers named so far per kind (`conv2d` -> 2 names the next one `conv2d_3`).
    counters: HashMap<&'static str, usize>,
}

impl RandNet {
    /// The program of `lines` with a probe head (flatten, dense(1), MSE) on `cur`: what the
    /// checker says about the network so far.
    fn probe(&self, lines: &[String], cur: &str) -> Result<Model, Box<dmc_grammar::Diagnostic>> {
        let src = format!(
            "input x: [{hw}, {hw}, 2]\ntarget probe: [1]\n{}\nprobe_out = {cur} |> flatten as probe_flatten |> dense(1) as probe_dense\nloss mse(probe_out, probe)\ntrain {{ batch: 1, optimizer: sgd(lr: 0.1) }}\n",
            lines.join("\n"),
            hw = self.hw
        );
        dmc_grammar::compile_source(&src, "random_net.dm").map_err(Box::new)
    }

    /// The next name of `kind` (not yet taken).
    fn name(&self, kind: &'static str) -> String {
        format!(
            "{kind}_{}",
            self.counters.get(kind).copied().unwrap_or(0) + 1
        )
    }

    /// Adds `stmts` (each reads earlier values; the last one becomes `cur`) taking one name of
    /// each of `kinds`, if the checker accepts the result. Layers the checker rejects for their
    /// shapes (a kernel larger than its input, ...) are skipped; anything else is a bug here.
    fn push(&mut self, stmts: Vec<String>, kinds: &[&'static str]) {
        let mut lines = self.lines.clone();
        let mut cur = self.cur.clone();
        for s in stmts {
            let v = format!("h{}", lines.len());
            lines.push(format!("{v} = {s}"));
            cur = v;
        }
        match self.probe(&lines, &cur) {
            Ok(_) => {
                self.lines = lines;
                self.cur = cur;
                for k in kinds {
                    *self.counters.entry(k).or_insert(0) += 1;
                }
            }
            Err(d) if d.kind == Kind::Shape => {}
            Err(d) => panic!("random layer rejected: {}\n{}", d.message, lines.join("\n")),
        }
    }

    /// The per-sample shape of `cur` after `lines`, as the checker computes it.
    fn shape_of(&self, lines: &[String], cur: &str) -> Vec<usize> {
        let m = match self.probe(lines, cur) {
            Ok(m) => m,
            Err(d) => panic!(
                "random network rejected: {}\n{}",
                d.message,
                lines.join("\n")
            ),
        };
        match m.nodes.iter().find(|n| n.name == "probe_flatten") {
            Some(n) => m.shape(n.inputs[0]).clone(),
            None => panic!("the probe has no flatten layer"),
        }
    }

    fn layer(&mut self, l: &RandLayer) {
        let cur = self.cur.clone();
        match *l {
            RandLayer::Conv {
                filters,
                k,
                stride,
                same,
                bias,
            } => {
                let pad = if same { "same" } else { "valid" };
                let s = format!(
                    "{cur} |> conv2d({filters}, {k}, stride: {stride}, padding: {pad}, bias: {bias}) as {}",
                    self.name("conv2d")
                );
                self.push(vec![s], &["conv2d"]);
            }
            RandLayer::Pool { max, size, stride } => {
                let (op, kind) = if max {
                    ("maxpool", "max_pooling2d")
                } else {
                    ("avgpool", "average_pooling2d")
                };
                let s = format!(
                    "{cur} |> {op}({size}, stride: {stride}) as {}",
                    self.name(kind)
                );
                self.push(vec![s], &[kind]);
            }
            RandLayer::Act(a) => {
                let s = format!(
                    "{cur} |> {} as {}",
                    act_of(a).name(),
                    self.name("activation")
                );
                self.push(vec![s], &["activation"]);
            }
            RandLayer::Dropout => {
                let s = format!("{cur} |> dropout(0.3) as {}", self.name("dropout"));
                self.push(vec![s], &["dropout"]);
            }
            RandLayer::Residual => {
                let c = self.shape_of(&self.lines, &self.cur)[2];
                let conv = format!("{cur} |> conv2d({c}, 3) as {}", self.name("conv2d"));
                let n = self.lines.len();
                // The add is named by the checker (`add_<k>`, counted as here).
                self.push(vec![conv, format!("{cur} + h{n}")], &["conv2d", "add"]);
            }
            RandLayer::Branch(f, g) => {
                let (k1, k2) = {
                    let k = self.counters.get("activation").copied().unwrap_or(0);
                    (k + 1, k + 2)
                };
                let n = self.lines.len();
                let l = format!("{cur} |> {} as activation_{k1}", act_of(f).name());
                let r = format!("{cur} |> {} as activation_{k2}", act_of(g).name());
                self.push(
                    vec![l, r, format!("h{n} + h{}", n + 1)],
                    &["activation", "activation", "add"],
                );
            }
        }
    }
}

/// A random network: input `[hw, hw, 2]`, the `layers` (skipping those the checker rejects for
/// their shapes), flatten, the dense layers `(units, bias, activation < 4)`, and a cross-entropy
/// (`ce`; the last dense layer then has at least 2 units, as cross-entropy needs 2 classes) or MSE
/// loss. `opt`: 0 SGD, 1 SGD momentum, 2 Nesterov, 3 Adam, 4 AdamW (with weight
/// decay).
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
            clip_value: None,
            clip_norm: None,
        },
        3 => adam(1e-3),
        _ => Optimizer::Adam {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-7,
            weight_decay: 1e-2,
            decoupled: true,
            clip_value: None,
            clip_norm: None,
        },
    };
    let mut net = RandNet {
        hw,
        lines: vec![],
        cur: "x".into(),
        counters: HashMap::new(),
    };
    for l in layers {
        net.layer(l);
    }
    let mut head = format!("{} |> flatten as flatten_1", net.cur);
    let mut acts = net.counters.get("activation").copied().unwrap_or(0);
    for (k, &(units, bias, a)) in dense.iter().enumerate() {
        // Cross-entropy needs at least 2 classes.
        let units = if ce && k + 1 == dense.len() {
            units.max(2)
        } else {
            units
        };
        head += &format!(" |> dense({units}, bias: {bias}) as dense_{}", k + 1);
        if a < 4 {
            acts += 1;
            head += &format!(" |> {} as activation_{acts}", act_of(a).name());
        }
    }
    let mut lines = net.lines.clone();
    lines.push(format!("out = {head}"));
    let target = if ce {
        "target y: int".to_string()
    } else {
        // MSE: the target has the output's shape, as the checker computes it.
        let classes = net.shape_of(&lines, "out")[0];
        format!("target y: [{classes}]")
    };
    let loss = if ce { "cross_entropy" } else { "mse" };
    let src = format!(
        "input x: [{hw}, {hw}, 2]\n{target}\n{}\nloss {loss}(out, y)\n",
        lines.join("\n")
    );
    checked_with(&src, batch, &optimizer)
}
