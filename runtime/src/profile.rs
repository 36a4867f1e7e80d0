//! `dmc run --profile`: the measured time of each plan kernel per training step, and its table.
//!
//! The backend that measures (the CUDA backend, with events around each launch:
//! [`crate::cuda::events`]) feeds one time per kernel launch into a [`ProfileAccumulator`]; this
//! module only aggregates and formats, so the arithmetic and the table are tested without a GPU.
//! The table has a column for a performance model's prediction, given by kernel id, so that a model
//! (which sees the rendered kernels) can be set beside the measurement without this module knowing it.

/// The measured time of one plan kernel, summed over the profiled training steps.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelTime {
    /// The plan kernel's id (`Plan::kernels` index) and name.
    pub kernel: usize,
    pub name: String,
    /// Launches of the kernel over the profiled steps (a plan step is one launch, a split-K
    /// kernel's reduction entry included).
    pub launches: u64,
    /// Their time, in milliseconds.
    pub total_ms: f64,
    /// The kernel's time in one step, median over the steps, in milliseconds: what the table
    /// shows (one step stalled by the machine, a page-fault storm or a descheduled thread, moves
    /// the mean of a few steps by more than the model's error).
    pub median_ms: f64,
}

/// Per-kernel times over `steps` training steps.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KernelProfile {
    /// Training steps the times cover.
    pub steps: u64,
    /// Whether the first training step was left out (the warm-up: first launches load modules
    /// and fill caches); it is whenever more than one step ran.
    pub warmup_excluded: bool,
    /// Kernels that ran, in plan kernel order.
    pub kernels: Vec<KernelTime>,
    /// How the times were taken, e.g. `CUDA events around each launch`.
    pub clock: String,
}

/// Per kernel id: launches and milliseconds, in all and per step.
#[derive(Debug, Clone, Default)]
struct Bucket {
    steps: u64,
    per_kernel: Vec<(u64, f64)>,
    per_step: Vec<Vec<f64>>,
}

impl Bucket {
    fn add(&mut self, kernel: usize, ms: f64) {
        if self.per_kernel.len() <= kernel {
            self.per_kernel.resize(kernel + 1, (0, 0.0));
            self.per_step.resize(kernel + 1, vec![]);
        }
        let e = &mut self.per_kernel[kernel];
        e.0 += 1;
        e.1 += ms;
        let at = self.steps.max(1) as usize - 1;
        let v = &mut self.per_step[kernel];
        if v.len() <= at {
            v.resize(at + 1, 0.0);
        }
        v[at] += ms;
    }

    /// Kernel `k`'s median time per step (0 in the steps it did not run).
    fn median(&self, k: usize) -> f64 {
        let mut v = self.per_step.get(k).cloned().unwrap_or_default();
        v.resize(self.steps.max(1) as usize, 0.0);
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    }
}

/// Collects launch times by training step. Steps are told apart by their step counter (the
/// 1-based training step `Backend::run` gets), so the several runs of one step (accumulated
/// micro-batches, clip_norm's norm and update passes) count as one step.
#[derive(Debug, Clone)]
pub struct ProfileAccumulator {
    names: Vec<String>,
    clock: String,
    last_step: Option<u64>,
    /// The first step seen (the warm-up), and every later one.
    first: Bucket,
    rest: Bucket,
}

impl ProfileAccumulator {
    /// For a plan whose kernel `i` is named `names[i]`, timed by `clock` (what the table says
    /// the times are, e.g. `CUDA events around each launch`).
    pub fn new(names: Vec<String>, clock: &str) -> Self {
        ProfileAccumulator {
            names,
            clock: clock.to_string(),
            last_step: None,
            first: Bucket::default(),
            rest: Bucket::default(),
        }
    }

    /// One launch of kernel `kernel` in training step `step`, taking `ms` milliseconds.
    pub fn record(&mut self, step: u64, kernel: usize, ms: f64) {
        if self.last_step != Some(step) {
            if self.last_step.is_none() {
                self.first.steps = 1;
            } else {
                self.rest.steps += 1;
            }
            self.last_step = Some(step);
        }
        if self.rest.steps == 0 {
            self.first.add(kernel, ms);
        } else {
            self.rest.add(kernel, ms);
        }
    }

    /// The profile so far: the steps after the first, or the first when it is the only one.
    pub fn profile(&self) -> KernelProfile {
        let (b, warmup_excluded) = if self.rest.steps > 0 {
            (&self.rest, true)
        } else {
            (&self.first, false)
        };
        KernelProfile {
            steps: b.steps,
            warmup_excluded,
            clock: self.clock.clone(),
            kernels: b
                .per_kernel
                .iter()
                .enumerate()
                .filter(|(_, &(n, _))| n > 0)
                .map(|(k, &(launches, total_ms))| KernelTime {
                    kernel: k,
                    name: self
                        .names
                        .get(k)
                        .cloned()
                        .unwrap_or_else(|| format!("#{k}")),
                    launches,
                    total_ms,
                    median_ms: b.median(k),
                })
                .collect(),
        }
    }
}

/// A count per step: an integer when it is one, else two decimals.
fn per_step(count: u64, steps: u64) -> String {
    let steps = steps.max(1);
    if count / steps * steps == count {
        (count / steps).to_string()
    } else {
        format!("{:.2}", count as f64 / steps as f64)
    }
}

/// The profile as a markdown table (pasted into BENCHMARKS.md), slowest kernel first: kernel,
/// launches per step, median µs per step ([`KernelTime::median_ms`]), share of the step's kernel time, and, when `predicted`
/// is given, the prediction (seconds of one launch of the kernel of that id, e.g. a performance
/// model's for the rendered kernel; `None`: no prediction) times the launches per step, with the
/// ratio measured / predicted. The last row is the step's total.
pub fn profile_table(
    p: &KernelProfile,
    predicted: Option<&dyn Fn(usize) -> Option<f64>>,
) -> String {
    if p.kernels.is_empty() {
        return "Measured per kernel: no kernel ran in a profiled step.\n".into();
    }
    let steps = p.steps.max(1) as f64;
    let total_us: f64 = p.kernels.iter().map(|k| k.median_ms).sum::<f64>() * 1e3;
    let mut rows: Vec<&KernelTime> = p.kernels.iter().collect();
    rows.sort_by(|a, b| {
        b.median_ms
            .total_cmp(&a.median_ms)
            .then(a.kernel.cmp(&b.kernel))
    });
    let mut out = String::new();
    out.push_str(&format!(
        "Measured per kernel ({}), median of {} step{}{}:\n\n",
        p.clock,
        p.steps,
        if p.steps == 1 { "" } else { "s" },
        if p.warmup_excluded {
            " after the first (warm-up)"
        } else {
            ""
        }
    ));
    match predicted {
        Some(_) => out.push_str(
            "| kernel | launches/step | µs/step | share | predicted µs/step | measured/predicted |\n|---|---:|---:|---:|---:|---:|\n",
        ),
        None => out.push_str("| kernel | launches/step | µs/step | share |\n|---|---:|---:|---:|\n"),
    }
    let mut predicted_total: Option<f64> = predicted.map(|_| 0.0);
    for k in rows {
        let us = k.median_ms * 1e3;
        let share = if total_us > 0.0 {
            100.0 * us / total_us
        } else {
            0.0
        };
        out.push_str(&format!(
            "| {} | {} | {us:.1} | {share:.1}% |",
            k.name,
            per_step(k.launches, p.steps)
        ));
        if let Some(f) = predicted {
            match f(k.kernel) {
                Some(s) => {
                    let pred_us = s * 1e6 * k.launches as f64 / steps;
                    if let Some(t) = predicted_total.as_mut() {
                        *t += pred_us;
                    }
                    out.push_str(&format!(" {pred_us:.1} | {} |", ratio(us, pred_us)));
                }
                None => out.push_str(" - | - |"),
            }
        }
        out.push('\n');
    }
    let launches: u64 = p.kernels.iter().map(|k| k.launches).sum();
    out.push_str(&format!(
        "| **step** | {} | {total_us:.1} | 100% |",
        per_step(launches, p.steps)
    ));
    if let Some(t) = predicted_total {
        out.push_str(&format!(" {t:.1} | {} |", ratio(total_us, t)));
    }
    out.push('\n');
    out
}

fn ratio(measured: f64, predicted: f64) -> String {
    if predicted > 0.0 {
        format!("{:.2}x", measured / predicted)
    } else {
        "-".into()
    }
}
