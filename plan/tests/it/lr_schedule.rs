//! Learning-rate schedules: each schedule's rates against PyTorch's *chainable* form of the same
//! scheduler (each step's rate from the previous one, as `torch.optim.lr_scheduler` computes it
//! when stepped), an independent formula; the warmup ramp; runs longer than a decay; the check of
//! a decay that its warmup leaves no step of.

use dmc_plan::schedule::{Decay, LrSchedule};

const BASE: f32 = 0.1;

fn rates(s: &LrSchedule, steps: u64, run: u64) -> Vec<f64> {
    (1..=steps).map(|t| s.lr_at(BASE, t, run) as f64).collect()
}

fn close(a: f64, b: f64) -> bool {
    // one f32 rounding of the rate
    (a - b).abs() <= 2.0 * f32::EPSILON as f64 * a.abs().max(b.abs()) + 1e-12
}

fn assert_rates(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(close(*g, *w), "step {}: {g} vs {w}", i + 1);
    }
}

#[test]
fn the_default_is_constant() {
    let s = LrSchedule::default();
    assert!(s.is_constant());
    assert!(rates(&s, 50, 50).iter().all(|&r| r == BASE as f64));
}

#[test]
fn warmup_ramps_linearly_as_linear_lr_then_holds() {
    // PyTorch LinearLR(start_factor=1/W, total_iters=W-1), chainable: factor(t) =
    // 1 + (1 - start) / (total * start + (t - 1) * (1 - start)) times the previous rate
    let w = 8u64;
    let s = LrSchedule {
        warmup: w,
        decay: Decay::Constant,
    };
    let start = 1.0 / w as f64;
    let total = (w - 1) as f64;
    let mut want = vec![BASE as f64 * start];
    for t in 1..20u64 {
        let prev = *want.last().unwrap();
        let next = if (t as f64) <= total {
            prev * (1.0 + (1.0 - start) / (total * start + (t as f64 - 1.0) * (1.0 - start)))
        } else {
            prev
        };
        want.push(next);
    }
    assert_rates(&rates(&s, 20, 20), &want);
    assert_eq!(
        s.lr_at(BASE, w, 20),
        BASE,
        "the warmup ends at the base rate"
    );
}

#[test]
fn step_decay_matches_step_lr() {
    // StepLR chainable: the rate is multiplied by gamma at every multiple of step_size
    let s = LrSchedule {
        warmup: 0,
        decay: Decay::Step {
            every: 3,
            gamma: 0.5,
        },
    };
    let mut want = vec![BASE as f64];
    for t in 1..14u64 {
        let prev = *want.last().unwrap();
        want.push(if t % 3 == 0 { prev * 0.5 } else { prev });
    }
    assert_rates(&rates(&s, 14, 14), &want);
}

/// CosineAnnealingLR's chainable form over `t_max` steps: eta_t = eta_min + (eta_{t-1} - eta_min)
/// * (1 + cos(pi t / T)) / (1 + cos(pi (t - 1) / T)).
fn cosine_chain(base: f64, min: f64, t_max: u64, steps: u64) -> Vec<f64> {
    let pi = std::f64::consts::PI;
    let mut v = vec![base];
    for t in 1..steps {
        let prev = *v.last().unwrap();
        let tf = t as f64;
        let tm = t_max as f64;
        v.push(
            min + (prev - min) * (1.0 + (pi * tf / tm).cos())
                / (1.0 + (pi * (tf - 1.0) / tm).cos()),
        );
    }
    v
}

#[test]
fn cosine_after_warmup_matches_cosine_annealing_lr() {
    let (w, run) = (5u64, 45u64);
    let min = 0.01f64;
    let s = LrSchedule {
        warmup: w,
        decay: Decay::Cosine {
            steps: None,
            min_lr: min as f32,
        },
    };
    let got = rates(&s, run, run);
    // the warmup, then T_max = run - warmup steps of cosine
    for (t, g) in got.iter().take(w as usize).enumerate() {
        assert!(
            close(*g, BASE as f64 * (t + 1) as f64 / w as f64),
            "warmup step {}",
            t + 1
        );
    }
    let want = cosine_chain(BASE as f64, min as f32 as f64, run - w, run - w);
    assert_rates(&got[w as usize..], &want);
    // decreasing after the warmup, above the minimum until the end
    for p in got[w as usize..].windows(2) {
        assert!(p[1] <= p[0]);
    }
    assert!(*got.last().unwrap() > min);
}

#[test]
fn a_decay_with_its_own_length_ignores_the_runs_and_stays_at_its_minimum_after() {
    let s = LrSchedule {
        warmup: 0,
        decay: Decay::Cosine {
            steps: Some(10),
            min_lr: 0.0,
        },
    };
    assert_eq!(rates(&s, 30, 1000), rates(&s, 30, 30));
    let want = cosine_chain(BASE as f64, 0.0, 10, 10);
    assert_rates(&rates(&s, 10, 5)[..], &want);
    for t in 11..30 {
        assert_eq!(s.lr_at(BASE, t, 30), 0.0, "step {t}");
    }
}

#[test]
fn linear_decay_is_a_straight_line_to_its_minimum() {
    let s = LrSchedule {
        warmup: 2,
        decay: Decay::Linear {
            steps: Some(12),
            min_lr: 0.02,
        },
    };
    // t - W = 0..10 over a span of 10: base + (min - base) * d / 10
    for d in 0..10u64 {
        let want = BASE as f64 + (0.02f32 as f64 - BASE as f64) * d as f64 / 10.0;
        assert!(close(s.lr_at(BASE, 3 + d, 12) as f64, want), "d {d}");
    }
    assert!(close(s.lr_at(BASE, 40, 12) as f64, 0.02f32 as f64));
}

#[test]
fn a_decay_its_warmup_leaves_no_step_of_is_refused() {
    let s = LrSchedule {
        warmup: 10,
        decay: Decay::Cosine {
            steps: None,
            min_lr: 0.0,
        },
    };
    let e = s.check(10).unwrap_err();
    assert!(
        e.contains("warmup of 10 steps leaves none of the 10 steps"),
        "{e}"
    );
    assert!(s.check(11).is_ok());
    // step decay and constant rates have no length
    let st = LrSchedule {
        warmup: 10,
        decay: Decay::Step {
            every: 1,
            gamma: 0.9,
        },
    };
    assert!(st.check(3).is_ok());
}

#[test]
fn step_zero_is_step_one() {
    let s = LrSchedule {
        warmup: 4,
        decay: Decay::Constant,
    };
    assert_eq!(s.lr_at(BASE, 0, 10), s.lr_at(BASE, 1, 10));
}
