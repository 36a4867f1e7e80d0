//! The optimizer update rules and the learning rate: the one description of an optimizer, used by
//! the language (`optimizer: sgd(...)`, as `Optimizer`), the update ops of the plan, the CPU
//! backend's updates and the CUDA code generator.

use serde::{Deserialize, Serialize};

/// An optimizer update rule: the optimizer of a program (the language's `Optimizer`), of a plan
/// (`Plan::optimizer`) and of every update op (`OptimOp::Update`, the fused weight-gradient + update
/// ops), with the semantics and state slots documented there. The rule of an op is
/// [`UpdateRule::of`] (beside `Op`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum UpdateRule {
    /// v = momentum*v + g + wd*w ; w -= lr * (nesterov ? g + wd*w + momentum*v : v)
    /// (PyTorch's formulation; momentum 0 is plain SGD and keeps no state).
    Sgd {
        lr: f32,
        momentum: f32,
        weight_decay: f32,
        nesterov: bool,
        /// `clip_value` of the training settings: every gradient element clamped to [-v, v]
        /// before the rule uses it (before weight decay), as `clip_grad_value_` before `step()`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        clip_value: Option<f32>,
        /// `clip_norm` of the training settings: every gradient scaled by min(1, m / (‖g‖ + 1e-6))
        /// with ‖g‖ the global L2 norm of all gradients (`clip_grad_norm_`), read by the update
        /// from the plan's `norm_sq` buffer (an extra `In` argument of the update op).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        clip_norm: Option<f32>,
    },
    /// Adam with bias correction. `decoupled` = AdamW (weight decay applied to the weights directly,
    /// w -= lr*wd*w), otherwise L2 added to the gradient (as torch.optim.Adam).
    Adam {
        lr: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
        weight_decay: f32,
        decoupled: bool,
        /// As for `Sgd`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        clip_value: Option<f32>,
        /// As for `Sgd`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        clip_norm: Option<f32>,
    },
    /// RMSprop, PyTorch's `torch.optim.RMSprop` (not centered): g += wd*w; v = alpha v + (1-alpha)
    /// g^2; with momentum: buf = momentum buf + g / (sqrt(v) + eps), w -= lr buf; without:
    /// w -= lr g / (sqrt(v) + eps).
    RmsProp {
        lr: f32,
        alpha: f32,
        eps: f32,
        weight_decay: f32,
        momentum: f32,
        /// As for `Sgd`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        clip_value: Option<f32>,
        /// As for `Sgd`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        clip_norm: Option<f32>,
    },
    /// Lion (Chen et al. 2023; PyTorch `lion-pytorch` semantics): w *= 1 - lr wd; w -= lr
    /// sign(beta1 m + (1-beta1) g); m = beta2 m + (1-beta2) g (sign(0) = 0). One state tensor.
    Lion {
        lr: f32,
        beta1: f32,
        beta2: f32,
        weight_decay: f32,
        /// As for `Sgd`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        clip_value: Option<f32>,
        /// As for `Sgd`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        clip_norm: Option<f32>,
    },
}

impl UpdateRule {
    /// The learning rate.
    pub fn lr(&self) -> f32 {
        match self {
            UpdateRule::Sgd { lr, .. }
            | UpdateRule::Adam { lr, .. }
            | UpdateRule::RmsProp { lr, .. }
            | UpdateRule::Lion { lr, .. } => *lr,
        }
    }

    /// The rule with learning rate `lr` (a step's rate from the schedule).
    pub fn with_lr(&self, lr: f32) -> UpdateRule {
        let mut r = *self;
        match &mut r {
            UpdateRule::Sgd { lr: l, .. }
            | UpdateRule::Adam { lr: l, .. }
            | UpdateRule::RmsProp { lr: l, .. }
            | UpdateRule::Lion { lr: l, .. } => *l = lr,
        }
        r
    }

    /// The gradient clamp of the training settings' `clip_value` (`None`: no clipping).
    pub fn clip_value(&self) -> Option<f32> {
        match self {
            UpdateRule::Sgd { clip_value, .. }
            | UpdateRule::Adam { clip_value, .. }
            | UpdateRule::RmsProp { clip_value, .. }
            | UpdateRule::Lion { clip_value, .. } => *clip_value,
        }
    }

    /// The rule with every gradient element clamped to [-v, v] first (`None`: no clipping).
    pub fn with_clip_value(&self, v: Option<f32>) -> UpdateRule {
        let mut r = *self;
        match &mut r {
            UpdateRule::Sgd { clip_value, .. }
            | UpdateRule::Adam { clip_value, .. }
            | UpdateRule::RmsProp { clip_value, .. }
            | UpdateRule::Lion { clip_value, .. } => *clip_value = v,
        }
        r
    }

    /// The global-norm bound of the training settings' `clip_norm` (`None`: no clipping).
    pub fn clip_norm(&self) -> Option<f32> {
        match self {
            UpdateRule::Sgd { clip_norm, .. }
            | UpdateRule::Adam { clip_norm, .. }
            | UpdateRule::RmsProp { clip_norm, .. }
            | UpdateRule::Lion { clip_norm, .. } => *clip_norm,
        }
    }

    /// The rule with the gradients scaled to a global L2 norm of at most `m` (`None`: not).
    pub fn with_clip_norm(&self, m: Option<f32>) -> UpdateRule {
        let mut r = *self;
        match &mut r {
            UpdateRule::Sgd { clip_norm, .. }
            | UpdateRule::Adam { clip_norm, .. }
            | UpdateRule::RmsProp { clip_norm, .. }
            | UpdateRule::Lion { clip_norm, .. } => *clip_norm = m,
        }
        r
    }

    /// The factor `clip_norm: m` scales every gradient by, given the squared global norm:
    /// min(1, m / (sqrt(norm_sq) + 1e-6)) in f32, as `clip_grad_norm_` (1 without `clip_norm`).
    pub fn norm_scale(&self, norm_sq: f32) -> f32 {
        match self.clip_norm() {
            Some(m) => {
                let c = m / (norm_sq.sqrt() + 1e-6);
                if c < 1.0 {
                    c
                } else {
                    1.0
                }
            }
            None => 1.0,
        }
    }

    /// `g` clamped to [-v, v] when the rule clips by value (NaN stays NaN, as `torch.clamp`).
    #[inline(always)]
    pub fn clip(&self, g: f32) -> f32 {
        match self.clip_value() {
            Some(v) => g.clamp(-v, v),
            None => g,
        }
    }

    /// Names of the optimizer-state slots the rule reads and overwrites (after the weight):
    /// the velocity, Adam's two moments, RMSprop's square average (and its momentum buffer), or
    /// Lion's one moment.
    pub fn state_names(&self) -> &'static [&'static str] {
        match self {
            UpdateRule::Sgd { momentum, .. } if *momentum != 0.0 => &["v"],
            UpdateRule::Sgd { .. } => &[],
            UpdateRule::Adam { .. } => &["m", "v"],
            UpdateRule::RmsProp { momentum, .. } if *momentum != 0.0 => &["v", "buf"],
            UpdateRule::RmsProp { .. } => &["v"],
            UpdateRule::Lion { .. } => &["m"],
        }
    }

    /// The names of a bias' state in a weight-gradient op that updates the bias too (the fused
    /// `Conv2dBwdWeightUpdate`/`DenseBwdWeightUpdate` with `bias`): [`UpdateRule::state_names`]
    /// prefixed by `b_`, so that one kernel's parameters stay distinct.
    pub fn bias_state_names(&self) -> &'static [&'static str] {
        match self {
            UpdateRule::Sgd { momentum, .. } if *momentum != 0.0 => &["b_v"],
            UpdateRule::Sgd { .. } => &[],
            UpdateRule::Adam { .. } => &["b_m", "b_v"],
            UpdateRule::RmsProp { momentum, .. } if *momentum != 0.0 => &["b_v", "b_buf"],
            UpdateRule::RmsProp { .. } => &["b_v"],
            UpdateRule::Lion { .. } => &["b_m"],
        }
    }

    /// The state slots whose values are never negative (they are square averages: RMSprop's and
    /// Adam's `v`), which random test data must respect.
    pub fn nonnegative_states(&self) -> &'static [&'static str] {
        match self {
            UpdateRule::Adam { .. } | UpdateRule::RmsProp { .. } => &["v", "b_v"],
            UpdateRule::Sgd { .. } | UpdateRule::Lion { .. } => &[],
        }
    }

    /// FLOPs of the update of one element.
    pub fn flops_per_elem(&self) -> u64 {
        let clip = if self.clip_value().is_some() { 2 } else { 0 };
        clip + match self {
            UpdateRule::Sgd { .. } => 4,
            UpdateRule::Adam { .. } => 10,
            UpdateRule::RmsProp { .. } => 8,
            UpdateRule::Lion { .. } => 8,
        }
    }

    /// The kernel name of its unfused update op (`Op::kind_name`).
    pub fn op_name(&self) -> &'static str {
        match self {
            UpdateRule::Sgd { .. } => "sgd_update",
            UpdateRule::Adam { .. } => "adam_update",
            UpdateRule::RmsProp { .. } => "rmsprop_update",
            UpdateRule::Lion { .. } => "lion_update",
        }
    }
}

/// A learning rate training can use: a finite, positive number that is a normal `f32` (so it is
/// neither rounded to 0 nor to infinity where the update uses it). The one type through which every
/// learning rate enters dmc: the `.dm` optimizer, `dmc run --lr`, [`CompileOptions`]'s override and
/// the runtime's check of a plan.
///
/// [`CompileOptions`]: https://docs.rs/dmc-compiler
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct LearningRate(f32);

impl LearningRate {
    /// Validates `v`; the error says what is wrong with it (without the "what to do", which
    /// depends on where the value came from).
    pub fn new(v: f64) -> Result<Self, String> {
        // 1e39, not 1000000000000000000000000000000000000000
        let show = |v: f64| {
            if v != 0.0 && (v.abs() >= 1e6 || v.abs() < 1e-4) {
                format!("{v:e}")
            } else {
                format!("{v}")
            }
        };
        if v.is_nan() {
            return Err("the learning rate must be a number, found NaN".into());
        }
        if v <= 0.0 {
            return Err(format!(
                "the learning rate must be positive, found {}",
                show(v)
            ));
        }
        if v.is_infinite() || v > f32::MAX as f64 {
            return Err(format!(
                "the learning rate {} is too large: it becomes infinite as f32 (largest {:e})",
                show(v),
                f32::MAX
            ));
        }
        let f = v as f32;
        if !f.is_normal() {
            return Err(format!(
                "the learning rate {} is too small: as f32 it becomes {f:e} (smallest usable {:e})",
                show(v),
                f32::MIN_POSITIVE
            ));
        }
        Ok(LearningRate(f))
    }

    /// The value as used by the update.
    pub fn get(self) -> f32 {
        self.0
    }
}

impl std::str::FromStr for LearningRate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let v: f64 = s
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not a number"))?;
        LearningRate::new(v)
    }
}

impl std::fmt::Display for LearningRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}
