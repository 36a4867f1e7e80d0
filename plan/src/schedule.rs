//! Learning-rate schedules: the learning rate of each training step, as a function of the step, the
//! optimizer's base rate and the run's length. The plan carries the schedule
//! ([`Plan::schedule`](crate::plan::Plan::schedule)); the runtime computes each step's rate with
//! [`LrSchedule::lr_at`] and hands it to the update kernels as a launch argument, so no kernel bakes
//! a learning rate in (and `--lr` recompiles nothing).
//!
//! Steps are counted from 1, as the runtime's step counter is; below, `t = step - 1` and `W` is the
//! warmup. During the warmup (`t < W`) the rate ramps linearly, `base * (t + 1) / W` (PyTorch's
//! `LinearLR(start_factor=1/W, total_iters=W-1)`); after it the decay runs on `t - W` (PyTorch's
//! `SequentialLR` of the two):
//! * [`Decay::Constant`] is `base`;
//! * [`Decay::Step`] is `base * gamma^floor((t - W) / every)` (`StepLR(step_size=every, gamma)`);
//! * [`Decay::Cosine`] is `min + (base - min) * (1 + cos(pi * p)) / 2`, `p = (t - W) / (T - W)`
//!   clamped to 1, where `T` is the schedule's `steps` or else the run's total
//!   (`CosineAnnealingLR(T_max=T-W, eta_min=min)` over the run, then flat at `min`);
//! * [`Decay::Linear`] is `base + (min - base) * p` with the same `p`.
//!
//! The rate is computed in f64 and rounded once to f32, the precision of the update.

use serde::{Deserialize, Serialize};

/// What the learning rate does after the warmup.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Decay {
    /// The base rate throughout.
    Constant,
    /// Multiplied by `gamma` every `every` steps.
    Step { every: u64, gamma: f32 },
    /// Half a cosine from the base rate down to `min_lr` over `steps` steps in all (warmup
    /// included; `None`: the run's steps).
    Cosine { steps: Option<u64>, min_lr: f32 },
    /// A straight line from the base rate down to `min_lr` over `steps` steps in all.
    Linear { steps: Option<u64>, min_lr: f32 },
}

/// A learning-rate schedule: a linear warmup of `warmup` steps, then a decay.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    pub warmup: u64,
    pub decay: Decay,
}

impl Default for LrSchedule {
    /// The constant rate of a program without a schedule.
    fn default() -> Self {
        LrSchedule {
            warmup: 0,
            decay: Decay::Constant,
        }
    }
}

impl LrSchedule {
    /// Whether the rate is the base rate at every step.
    pub fn is_constant(&self) -> bool {
        self.warmup == 0 && self.decay == Decay::Constant
    }

    /// The number of steps the decay's shape is fitted to: its own `steps`, else `run_steps`;
    /// `None` for decays that have no length.
    pub fn length(&self, run_steps: u64) -> Option<u64> {
        match self.decay {
            Decay::Cosine { steps, .. } | Decay::Linear { steps, .. } => {
                Some(steps.unwrap_or(run_steps))
            }
            Decay::Constant | Decay::Step { .. } => None,
        }
    }

    /// Whether the schedule fits a run of `run_steps` steps; the error says why not. A cosine or
    /// linear decay needs at least one step after its warmup.
    pub fn check(&self, run_steps: u64) -> Result<(), String> {
        match self.length(run_steps) {
            Some(t) if t <= self.warmup => Err(format!(
                "the learning-rate schedule's warmup of {} steps leaves none of the {t} steps it decays over",
                self.warmup
            )),
            _ => Ok(()),
        }
    }

    /// The learning rate of the 1-based training step `step` (0 is treated as 1), for the base
    /// rate `base`, in a run of `run_steps` steps (the length a cosine or linear decay without its
    /// own `steps` is fitted to).
    pub fn lr_at(&self, base: f32, step: u64, run_steps: u64) -> f32 {
        let t = step.max(1) - 1;
        let base = base as f64;
        if t < self.warmup {
            return (base * (t + 1) as f64 / self.warmup as f64) as f32;
        }
        let d = t - self.warmup;
        // the fraction of a cosine or linear decay done, at most 1
        let progress = || {
            let total = self.length(run_steps).unwrap_or(0);
            let span = total.saturating_sub(self.warmup).max(1);
            (d as f64 / span as f64).min(1.0)
        };
        let lr = match self.decay {
            Decay::Constant => base,
            Decay::Step { every, gamma } => {
                let k = d / every.max(1);
                base * (gamma as f64).powf(k as f64)
            }
            Decay::Cosine { min_lr, .. } => {
                let min = min_lr as f64;
                min + (base - min) * 0.5 * (1.0 + (std::f64::consts::PI * progress()).cos())
            }
            Decay::Linear { min_lr, .. } => base + (min_lr as f64 - base) * progress(),
        };
        lr as f32
    }

    /// One line for reports: `cosine over the run to 0, after 100 linear warmup steps`.
    pub fn describe(&self) -> String {
        let decay = match self.decay {
            Decay::Constant => "constant".to_string(),
            Decay::Step { every, gamma } => format!("x{gamma} every {every} steps"),
            Decay::Cosine { steps, min_lr } => format!("cosine {} to {min_lr}", over(steps)),
            Decay::Linear { steps, min_lr } => format!("linear {} to {min_lr}", over(steps)),
        };
        match self.warmup {
            0 => decay,
            w => format!("{decay}, after {w} linear warmup steps"),
        }
    }
}

fn over(steps: Option<u64>) -> String {
    match steps {
        Some(s) => format!("over {s} steps"),
        None => "over the run".into(),
    }
}
