//! Rematerialization: drop saved forward values and recompute them in the backward, to fit a cap.
//!
//! **Chain.** The forward graph is cut at its articulation values (a forward value that is the
//! only one crossing from the nodes before it to the nodes after it, in topological order): the
//! pieces between cuts are the *stages* of a chain (a layer, a conv + its activation, a residual
//! block). A cut whose value only feeds an elementwise op that will run in place is skipped, so
//! a conv and its activation are one stage. Per stage the [`ChainCosts`] record its forward FLOPs
//! ([`crate::cost`]), the bytes of its output `a_i`, of everything its backward reads (`xbar_i`,
//! which includes `a_i`), of its transient forward memory and of the gradient it sends back.
//!
//! **Optimal persistent checkpointing** (rotor, Herrmann et al. 2019): [`Dp`] solves
//! `opt(s, t, m)` = the least forward FLOPs to backpropagate stages `s..=t`, given `a_{s-1}` and
//! `δ_t` held, within `m` memory buckets, choosing at every sub-chain between
//! * *keep all* of stage `s` (`F_all`: its saved values stay), solve `s+1..=t`, run `B_s`;
//! * *checkpoint* `a_{k-1}`: run stages `s..k-1` without keeping anything but the last output,
//!   solve `k..=t`, then solve `s..=k-1` again from `a_{s-1}` (recomputation), with `δ_{k-1}`
//!   held in the place of `a_{k-1}` and `δ_t`'s bytes free again (its backward has consumed it:
//!   counting it held too made every level of the recursion look a gradient larger, so that a
//!   strategy recomputing from far back looked as costly in memory as one keeping checkpoints,
//!   and deep_convnet's floor was 208 MB instead of 103 MB).
//!
//! Checkpoint-all (no recomputation) and sqrt(n) segments are particular strategies of this
//! family, so the optimum is never worse than either under the same cost model; the tests check
//! the DP against an exhaustive enumeration of all strategies. The DP is cubic in the number of
//! stages: a chain longer than [`MAX_DP_STAGES`] is planned on that many groups of consecutive
//! stages (each group checkpointed and recomputed as a whole), which keeps `--vram-cap` on a
//! network of thousands of layers to seconds.
//!
//! **Rewrite.** The strategy is a sequence of stage executions and backward steps. The first
//! execution of a stage is the original forward; every later one is a copy of the stage's forward
//! nodes (new nodes named `… (recompute k)`, same ops, reading the latest instance of their
//! inputs). Each backward node reads the instance of its forward values that is current when its
//! stage's backward runs. Copies are gated (`Graph::not_before`) on the backward step before them
//! in the sequence, so the scheduler runs them right before the backward that needs them.
//! Recomputation repeats the same kernels on the same inputs: results are bit-identical.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use petgraph::stable_graph::NodeIndex;
use petgraph::visit::EdgeRef;
use petgraph::Direction;

use crate::cost::node_flops;
use crate::ctx::Ctx;
pub use crate::ctx::{RematMode, Strategy};
use crate::error::CompileError;
use crate::ir::{Edge, Graph, Phase, Value};
use crate::op::{ElementwiseOp, Op};
use crate::plan::{layer_of, Mode};

/// Memory buckets of the DP: the budget axis is the chain's memory with nothing recomputed,
/// divided into this many parts (sizes are rounded up, so a solution never uses more than it
/// claims).
pub const BUCKETS: u64 = 512;

/// One stage of the forward chain.
#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    /// Forward nodes (kernels and views), in topological order.
    pub nodes: Vec<NodeIndex>,
    /// The stage's output `a_i` (a cut value).
    pub out: Value,
}

/// Per-stage costs (FLOPs) and sizes (any unit: bytes, or buckets in the DP).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChainCosts {
    /// Forward FLOPs of each stage.
    pub f: Vec<u64>,
    /// Size of the stage output `a_i` (also the size of its gradient `δ_i`).
    pub w: Vec<u64>,
    /// Size of what the stage's backward reads from its forward, `a_i` included.
    pub xbar: Vec<u64>,
    /// Transient memory of the stage's forward beyond its input and output.
    pub tmp: Vec<u64>,
    /// Size of the gradient the stage's backward produces (`δ_{i-1}`; 0 for the first stage).
    pub din: Vec<u64>,
    /// Of `xbar`, what is still read when `δ_{i-1}` is produced (values read only by an
    /// activation's backward, which runs first, are not).
    pub late: Vec<u64>,
}

impl ChainCosts {
    pub fn len(&self) -> usize {
        self.f.len()
    }
    pub fn is_empty(&self) -> bool {
        self.f.is_empty()
    }
    /// Rounds every size up to `unit`s.
    pub fn in_units(&self, unit: u64) -> ChainCosts {
        let u = |v: &Vec<u64>| v.iter().map(|x| x.div_ceil(unit.max(1))).collect();
        ChainCosts {
            f: self.f.clone(),
            w: u(&self.w),
            xbar: u(&self.xbar),
            tmp: u(&self.tmp),
            din: u(&self.din),
            late: u(&self.late),
        }
    }
    /// Peak of running stages `s..k` (exclusive) keeping only each output, `a_{s-1}` held.
    fn chain_peak(&self, s: usize, k: usize) -> u64 {
        (s..k)
            .map(|i| if i > s { self.w[i - 1] } else { 0 } + self.w[i] + self.tmp[i])
            .max()
            .unwrap_or(0)
    }
    /// Peak of the stage's backward (`δ_i` produced by the caller, `δ_{i-1}` counted).
    fn bwd_peak(&self, s: usize) -> u64 {
        (self.xbar[s] + self.w[s]).max(self.late[s] + self.w[s] + self.din[s])
    }
    fn leaf_peak(&self, s: usize) -> u64 {
        (self.xbar[s] + self.tmp[s]).max(self.late[s] + self.din[s])
    }
}

/// One step of a strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Run stage `stage`'s forward; `save`: keep its saved values for its backward.
    Fwd { stage: usize, save: bool },
    /// Run stage `i`'s backward.
    Bwd(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Choice {
    None,
    Leaf,
    All,
    Ckpt(usize),
}

const INF: u64 = u64::MAX;

/// The dynamic programme over `(s, t, m)`; see the module docs.
#[derive(Debug, Clone)]
pub struct Dp {
    c: ChainCosts,
    l: usize,
    mm: usize,
    cost: Vec<u64>,
    choice: Vec<Choice>,
}

impl Dp {
    /// Solves every sub-chain for every budget `0..=max_mem` (sizes of `c` in the same unit).
    pub fn solve(c: &ChainCosts, max_mem: u64) -> Dp {
        let l = c.len();
        let mm = max_mem as usize;
        let mut dp = Dp {
            c: c.clone(),
            l,
            mm,
            cost: vec![INF; l * l * (mm + 1)],
            choice: vec![Choice::None; l * l * (mm + 1)],
        };
        let mut pre = vec![0u64; l + 1];
        for i in 0..l {
            pre[i + 1] = pre[i].saturating_add(c.f[i]);
        }
        let mut cp = vec![0u64; l * (l + 1)];
        for s in 0..l {
            for k in s + 1..=l {
                cp[s * (l + 1) + k] = c.chain_peak(s, k);
            }
        }
        for len in 1..=l {
            for s in 0..=l - len {
                let t = s + len - 1;
                for m in 0..=mm {
                    let mu = m as u64;
                    let (mut best, mut ch) = (INF, Choice::None);
                    if s == t {
                        if c.leaf_peak(s) <= mu {
                            best = c.f[s];
                            ch = Choice::Leaf;
                        }
                    } else {
                        let x = c.xbar[s];
                        if x + c.tmp[s] <= mu && c.bwd_peak(s) <= mu {
                            let sub = dp.get(s + 1, t, (mu - x) as usize);
                            if sub < INF {
                                best = c.f[s] + sub;
                                ch = Choice::All;
                            }
                        }
                        for k in s + 1..=t {
                            let wk = c.w[k - 1];
                            if cp[s * (l + 1) + k] > mu || wk > mu {
                                continue;
                            }
                            let rest = (mu - wk) as usize;
                            let a = dp.get(k, t, rest);
                            // (δ_t, held outside, is dead once `k..=t` is done)
                            let b = dp.get(s, k - 1, rest + c.w[t] as usize);
                            if a < INF && b < INF {
                                let v = (pre[k] - pre[s]) + a + b;
                                if v < best {
                                    best = v;
                                    ch = Choice::Ckpt(k);
                                }
                            }
                        }
                    }
                    let i = dp.idx(s, t, m);
                    dp.cost[i] = best;
                    dp.choice[i] = ch;
                }
            }
        }
        dp
    }

    fn idx(&self, s: usize, t: usize, m: usize) -> usize {
        (s * self.l + t) * (self.mm + 1) + m
    }

    fn get(&self, s: usize, t: usize, m: usize) -> u64 {
        self.cost[self.idx(s, t, m.min(self.mm))]
    }

    /// The least forward FLOPs (all executions, the first forward included) within budget `m`,
    /// or `None` when infeasible.
    pub fn cost(&self, m: u64) -> Option<u64> {
        if self.l == 0 {
            return Some(0);
        }
        let v = self.get(0, self.l - 1, m.min(self.mm as u64) as usize);
        (v < INF).then_some(v)
    }

    /// The smallest feasible budget.
    pub fn min_budget(&self) -> Option<u64> {
        (0..=self.mm as u64).find(|m| self.cost(*m).is_some())
    }

    /// The optimal strategy within budget `m`.
    pub fn actions(&self, m: u64) -> Option<Vec<Action>> {
        self.cost(m)?;
        let mut out = vec![];
        if self.l > 0 {
            self.walk(0, self.l - 1, m.min(self.mm as u64) as usize, &mut out);
        }
        Some(out)
    }

    fn walk(&self, s: usize, t: usize, m: usize, out: &mut Vec<Action>) {
        match self.choice[self.idx(s, t, m)] {
            Choice::None => {}
            Choice::Leaf => {
                out.push(Action::Fwd {
                    stage: s,
                    save: true,
                });
                out.push(Action::Bwd(s));
            }
            Choice::All => {
                out.push(Action::Fwd {
                    stage: s,
                    save: true,
                });
                self.walk(s + 1, t, m - self.c.xbar[s] as usize, out);
                out.push(Action::Bwd(s));
            }
            Choice::Ckpt(k) => {
                for i in s..k {
                    out.push(Action::Fwd {
                        stage: i,
                        save: false,
                    });
                }
                let rest = m - self.c.w[k - 1] as usize;
                self.walk(k, t, rest, out);
                self.walk(s, k - 1, (rest + self.c.w[t] as usize).min(self.mm), out);
            }
        }
    }
}

/// Exhaustive search (for tests): every strategy of the family, as `(cost, peak)` pairs of
/// sub-chain `s..=t`, combined over all choices; `prune` drops dominated pairs (exact).
pub fn enumerate(c: &ChainCosts, prune: bool) -> Vec<(u64, u64)> {
    fn go(
        c: &ChainCosts,
        s: usize,
        t: usize,
        prune: bool,
        memo: &mut HashMap<(usize, usize), Vec<(u64, u64)>>,
    ) -> Vec<(u64, u64)> {
        if let Some(v) = memo.get(&(s, t)) {
            return v.clone();
        }
        let mut v = vec![];
        if s == t {
            v.push((c.f[s], c.leaf_peak(s)));
        } else {
            let x = c.xbar[s];
            let base = (x + c.tmp[s]).max(c.bwd_peak(s));
            for (cost, peak) in go(c, s + 1, t, prune, memo) {
                v.push((c.f[s] + cost, base.max(x + peak)));
            }
            for k in s + 1..=t {
                let fs: u64 = c.f[s..k].iter().sum();
                let wk = c.w[k - 1];
                let cp = c.chain_peak(s, k);
                let a = go(c, k, t, prune, memo);
                let b = go(c, s, k - 1, prune, memo);
                for (ca, pa) in &a {
                    for (cb, pb) in &b {
                        // δ_t (held outside) is dead while `s..k-1` runs
                        let after = (wk + pb).saturating_sub(c.w[t]);
                        v.push((fs + ca + cb, cp.max(wk + pa).max(after)));
                    }
                }
            }
        }
        if prune {
            v.sort();
            let mut kept: Vec<(u64, u64)> = vec![];
            for (cost, peak) in v {
                if kept.last().is_none_or(|(_, p)| peak < *p) {
                    kept.push((cost, peak));
                }
            }
            v = kept;
        }
        memo.insert((s, t), v.clone());
        v
    }
    if c.is_empty() {
        return vec![(0, 0)];
    }
    go(c, 0, c.len() - 1, prune, &mut HashMap::new())
}

/// The sqrt(n) strategy: segments of ceil(sqrt(L)) stages; the forward keeps each segment's
/// output, and each segment but the last is recomputed (keeping all) before its backward.
pub fn sqrt_actions(l: usize) -> Vec<Action> {
    let k = ((l as f64).sqrt().ceil() as usize).max(1);
    fn go(s: usize, l: usize, k: usize, out: &mut Vec<Action>) {
        if l - s <= k {
            out.extend((s..l).map(|i| Action::Fwd {
                stage: i,
                save: true,
            }));
            out.extend((s..l).rev().map(Action::Bwd));
            return;
        }
        out.extend((s..s + k).map(|i| Action::Fwd {
            stage: i,
            save: false,
        }));
        go(s + k, l, k, out);
        out.extend((s..s + k).map(|i| Action::Fwd {
            stage: i,
            save: true,
        }));
        out.extend((s..s + k).rev().map(Action::Bwd));
    }
    let mut out = vec![];
    if l > 0 {
        go(0, l, k, &mut out);
    }
    out
}

/// Forward FLOPs of a strategy (every execution).
pub fn actions_cost(c: &ChainCosts, actions: &[Action]) -> u64 {
    actions
        .iter()
        .map(|a| match a {
            Action::Fwd { stage, .. } => c.f.get(*stage).copied().unwrap_or(0),
            Action::Bwd(_) => 0,
        })
        .sum()
}

/// The forward chain of a training graph: its stages and their costs in bytes, or `None` when the
/// graph has no chain structure to exploit (fewer than two stages).
pub fn chain(g: &Graph) -> Option<(Vec<Stage>, ChainCosts)> {
    let order = g.topo_order().ok()?;
    let fwd: Vec<NodeIndex> = order
        .into_iter()
        .filter(|n| g.node(*n).phase == Phase::Forward && !g.node(*n).op.is_leaf())
        .collect();
    let n = fwd.len();
    if n == 0 {
        return None;
    }
    let pos: HashMap<NodeIndex, usize> = fwd.iter().enumerate().map(|(i, x)| (*x, i)).collect();
    // Every forward value that crosses position p (produced at <= p, read by a forward node
    // after p or by the loss).
    let mut spans: Vec<(Value, usize, usize)> = vec![];
    for (p, &x) in fwd.iter().enumerate() {
        for o in 0..g.node(x).outputs.len() {
            let last = g
                .consumers((x, o))
                .iter()
                .filter_map(|(c, _)| match g.node(*c).phase {
                    Phase::Forward => pos.get(c).copied(),
                    Phase::Loss => Some(n),
                    _ => None,
                })
                .max();
            if let Some(last) = last.filter(|l| *l > p) {
                spans.push(((x, o), p, last));
            }
        }
    }
    let is_bwd = |c: NodeIndex| matches!(g.node(c).phase, Phase::Backward | Phase::Update);
    // How many spans cross each position, and the sum of their indices in `spans` (which names
    // the span when it is the only one), by difference arrays.
    let mut count = vec![0i64; n + 1];
    let mut index_sum = vec![0i64; n + 1];
    for (k, (_, a, b)) in spans.iter().enumerate() {
        count[*a] += 1;
        count[*b] -= 1;
        index_sum[*a] += k as i64;
        index_sum[*b] -= k as i64;
    }
    let (mut crossing, mut sum) = (0i64, 0i64);
    let mut cuts: Vec<(usize, Value)> = vec![];
    for p in 0..n {
        crossing += count[p];
        sum += index_sum[p];
        if crossing != 1 {
            continue;
        }
        let Some(&(v, _, _)) = usize::try_from(sum).ok().and_then(|k| spans.get(k)) else {
            continue;
        };
        let cs = g.consumers(v);
        let elementwise_next = p + 1 < n
            && cs.len() == 1
            && matches!(
                g.node(cs[0].0).op,
                Op::Elementwise(ElementwiseOp::Unary(_))
                    | Op::Elementwise(ElementwiseOp::Dropout { .. })
            );
        if elementwise_next {
            continue;
        }
        cuts.push((p, v));
    }
    if cuts.last().map(|(p, _)| *p) != Some(n - 1) || cuts.len() < 2 {
        return None;
    }
    let mut stages = vec![];
    let mut start = 0;
    for (p, v) in &cuts {
        stages.push(Stage {
            nodes: fwd[start..=*p].to_vec(),
            out: *v,
        });
        start = p + 1;
    }
    let mut c = ChainCosts::default();
    for (i, st) in stages.iter().enumerate() {
        let mine: BTreeSet<NodeIndex> = st.nodes.iter().copied().collect();
        let bytes = |v: Value| -> u64 {
            let r = g.buffer_root(v);
            if mine.contains(&r.0) {
                g.ty(r).bytes()
            } else {
                0
            }
        };
        let mut saved: BTreeSet<Value> = BTreeSet::new();
        let mut late: BTreeSet<Value> = BTreeSet::new();
        let mut tmp = 0u64;
        let layers: BTreeSet<&str> = st
            .nodes
            .iter()
            .map(|x| layer_of(&g.node(*x).name))
            .collect();
        for &x in &st.nodes {
            for o in 0..g.node(x).outputs.len() {
                let v = (x, o);
                let cs = g.consumers(v);
                if cs.iter().any(|(c, _)| is_bwd(*c)) {
                    saved.insert(g.buffer_root(v));
                }
                // Read late: by a backward node of this stage other than an activation's.
                let is_out = g.buffer_root(v) == g.buffer_root(st.out);
                if cs.iter().any(|(c, _)| {
                    is_bwd(*c)
                        && !matches!(g.node(*c).op, Op::Elementwise(ElementwiseOp::UnaryBwd(_)))
                        && (!is_out || layers.contains(layer_of(&g.node(*c).name)))
                }) {
                    late.insert(g.buffer_root(v));
                }
            }
        }
        saved.insert(g.buffer_root(st.out));
        for &x in &st.nodes {
            if !g.is_kernel(x) {
                continue;
            }
            for o in 0..g.node(x).outputs.len() {
                let v = (x, o);
                let cs = g.consumers(v);
                let in_place_next = cs.len() == 1
                    && matches!(
                        g.node(cs[0].0).op,
                        Op::Elementwise(ElementwiseOp::Unary(_))
                            | Op::Elementwise(ElementwiseOp::Dropout { .. })
                    );
                if !saved.contains(&v) && !in_place_next {
                    tmp = tmp.max(g.ty(v).bytes());
                }
            }
        }
        c.f.push(st.nodes.iter().map(|x| node_flops(g, *x)).sum());
        c.w.push(bytes(st.out));
        c.xbar.push(saved.iter().map(|v| bytes(*v)).sum());
        c.tmp.push(tmp);
        c.late.push(late.iter().map(|v| bytes(*v)).sum());
        c.din.push(if i == 0 { 0 } else { c.w[i - 1] });
    }
    Some((stages, c))
}

/// The bucket size for `c`: the memory of keeping everything, over [`BUCKETS`].
pub fn unit_of(c: &ChainCosts) -> u64 {
    let top: u64 = c.xbar.iter().sum::<u64>()
        + (0..c.len())
            .map(|i| c.tmp[i] + c.w[i] + c.din[i])
            .max()
            .unwrap_or(0);
    top.div_ceil(BUCKETS).max(1)
}

/// The most stages the DP works on. Its time grows as `L^3 * BUCKETS` and its tables as
/// `L^2 * BUCKETS` (a 2,000-stage chain would need tens of GB), so a longer chain is cut into
/// this many groups of consecutive stages ([`group_bounds`]), each planned as one stage
/// ([`ChainCosts::grouped`]): the strategy then checkpoints and recomputes whole groups. 64
/// stages solve in a few tens of milliseconds, and every example network has fewer.
pub const MAX_DP_STAGES: usize = 64;

/// Group boundaries for a chain of `l` stages cut into at most `max` groups of consecutive
/// stages, as equal in length as possible (the longer ones first): group `k` is stages
/// `bounds[k]..bounds[k + 1]`. One group per stage when `l <= max`.
pub fn group_bounds(l: usize, max: usize) -> Vec<usize> {
    let groups = l.min(max.max(1));
    let (base, extra) = l
        .checked_div(groups)
        .zip(l.checked_rem(groups))
        .unwrap_or((0, 0));
    let mut bounds = vec![0];
    for k in 0..groups {
        let len = base + usize::from(k < extra);
        bounds.push(bounds[k] + len);
    }
    bounds
}

impl ChainCosts {
    /// The chain whose stage `k` is the group of stages `bounds[k]..bounds[k + 1]` of `self`,
    /// run as one: forward FLOPs add up, the output is the group's last, its backward reads what
    /// all of its stages read, and the transient sizes are bounds on what running the group's
    /// stages one after the other (keeping all, or only their outputs) and their backwards in
    /// reverse order holds at once, so a strategy planned on the groups fits the memory it
    /// claims.
    pub fn grouped(&self, bounds: &[usize]) -> ChainCosts {
        let mut g = ChainCosts::default();
        for k in 0..bounds.len().saturating_sub(1) {
            let (a, e) = (bounds[k], bounds[k + 1]);
            if a >= e {
                continue;
            }
            let b = e - 1;
            let xbar: u64 = self.xbar[a..e].iter().sum();
            // Running the stages keeping only outputs, or keeping all (what earlier stages keep
            // is in `xbar`): beyond the group's input and output.
            let tmp = self.tmp[a..e]
                .iter()
                .copied()
                .max()
                .unwrap_or(0)
                .max(self.chain_peak(a, e).saturating_sub(self.w[b]));
            // The backwards, last stage first: stage i's peak on top of what the stages before
            // it keep.
            let mut kept_before = 0u64;
            let mut bwd = 0u64;
            for i in a..e {
                bwd = bwd.max(kept_before + self.bwd_peak(i));
                kept_before += self.xbar[i];
            }
            g.f.push(self.f[a..e].iter().sum());
            g.w.push(self.w[b]);
            g.xbar.push(xbar);
            g.tmp.push(tmp);
            g.din.push(self.din[a]);
            g.late.push(bwd.saturating_sub(self.w[b] + self.din[a]));
        }
        g
    }
}

/// The actions of `strategy` for chain `c` (bytes), if any recomputation is involved. A chain
/// longer than [`MAX_DP_STAGES`] is planned by the DP on groups of stages, and each group's
/// execution expands to its stages' (forwards in order, backwards in reverse).
pub fn plan_actions(c: &ChainCosts, strategy: Strategy) -> Option<Vec<Action>> {
    let acts = match strategy {
        Strategy::KeepAll => return None,
        Strategy::SqrtN => sqrt_actions(c.len()),
        Strategy::Budget(b) => {
            let bounds = group_bounds(c.len(), MAX_DP_STAGES);
            let grouped = c.len() > MAX_DP_STAGES;
            let coarse = if grouped {
                c.grouped(&bounds)
            } else {
                c.clone()
            };
            let dp = solve_cached(&coarse.in_units(unit_of(&coarse)));
            let m = match dp.cost(b) {
                Some(_) => b,
                None => dp.min_budget()?,
            };
            let acts = dp.actions(m)?;
            if grouped {
                expand_groups(&acts, &bounds)
            } else {
                acts
            }
        }
    };
    let fwd = acts
        .iter()
        .filter(|a| matches!(a, Action::Fwd { .. }))
        .count();
    (fwd > c.len()).then_some(acts)
}

/// `Dp::solve(c, BUCKETS)`, reusing the last solution when it was for the same chain: `compile`'s
/// search over budgets plans the same chain a dozen times, and the DP is the costly part.
fn solve_cached(c: &ChainCosts) -> Arc<Dp> {
    static LAST: Mutex<Option<(ChainCosts, Arc<Dp>)>> = Mutex::new(None);
    if let Ok(last) = LAST.lock() {
        if let Some((costs, dp)) = last.as_ref() {
            if costs == c {
                return Arc::clone(dp);
            }
        }
    }
    let dp = Arc::new(Dp::solve(c, BUCKETS));
    if let Ok(mut last) = LAST.lock() {
        *last = Some((c.clone(), Arc::clone(&dp)));
    }
    dp
}

/// The actions on the stages of a strategy planned on groups of them (`bounds`, see
/// [`group_bounds`]): a group's forward runs its stages in order, its backward theirs in reverse.
fn expand_groups(acts: &[Action], bounds: &[usize]) -> Vec<Action> {
    let mut out = vec![];
    for a in acts {
        match *a {
            Action::Fwd { stage, save } => {
                let (s, e) = (bounds[stage], bounds[stage + 1]);
                out.extend((s..e).map(|i| Action::Fwd { stage: i, save }));
            }
            Action::Bwd(k) => {
                let (s, e) = (bounds[k], bounds[k + 1]);
                out.extend((s..e).rev().map(Action::Bwd));
            }
        }
    }
    out
}

/// Pass (train, `ctx.remat` not `KeepAll`): applies the chosen strategy (see the module docs).
pub fn rematerialize(g: &mut Graph, ctx: &Ctx) -> Result<bool, CompileError> {
    if ctx.mode != Mode::Train || ctx.remat == Strategy::KeepAll {
        return Ok(false);
    }
    let Some((stages, c)) = chain(g) else {
        return Ok(false);
    };
    let Some(acts) = plan_actions(&c, ctx.remat) else {
        return Ok(false);
    };
    rewrite(g, &stages, &acts)?;
    Ok(true)
}

/// Applies a strategy to the graph: copies of the re-executed stages, backward reads rewired to
/// the current instances, copies gated on the backward before them.
pub fn rewrite(g: &mut Graph, stages: &[Stage], acts: &[Action]) -> Result<(), CompileError> {
    let l = stages.len();
    let mut stage_of: HashMap<NodeIndex, usize> = HashMap::new();
    let mut stage_of_layer: HashMap<String, usize> = HashMap::new();
    for (i, st) in stages.iter().enumerate() {
        for x in &st.nodes {
            stage_of.insert(*x, i);
            stage_of_layer
                .entry(layer_of(&g.node(*x).name).to_string())
                .or_insert(i);
        }
    }
    // The stage whose backward each backward node belongs to: by the layer in its name, or the
    // latest stage it reads when that is later (a layernorm starting a stage: its backward is
    // named after its input, the previous stage's output, but reads its own stage's statistics,
    // and its weight's update, named after it, waits for it: put in the earlier stage, the update
    // would gate the recomputation that the backward itself waits for).
    let mut members: Vec<Vec<NodeIndex>> = vec![vec![]; l];
    for x in g.nodes() {
        if !matches!(g.node(x).phase, Phase::Backward | Phase::Update) || !g.is_kernel(x) {
            continue;
        }
        let by_read = g
            .inputs(x)
            .iter()
            .filter_map(|v| stage_of.get(&v.0).copied())
            .max();
        let by_name = stage_of_layer.get(layer_of(&g.node(x).name)).copied();
        if let Some(i) = by_name.max(by_read) {
            members[i].push(x);
        }
    }
    let mut runs = vec![0usize; l];
    let mut current: Vec<HashMap<Value, Value>> = vec![HashMap::new(); l];
    let mut gate: BTreeSet<NodeIndex> = BTreeSet::new();
    // The copies made since the gate was last set that wait for it, themselves or through an
    // input: only the first ones (no such input) carry it, the rest follow through their inputs.
    let mut covered: HashSet<NodeIndex> = HashSet::new();
    for a in acts {
        match *a {
            Action::Fwd { stage, .. } => {
                let st = stages
                    .get(stage)
                    .ok_or_else(|| CompileError::Internal(format!("remat: no stage {stage}")))?;
                runs[stage] += 1;
                if runs[stage] == 1 {
                    current[stage].clear();
                    continue;
                }
                let mut map: HashMap<Value, Value> = HashMap::new();
                for &x in &st.nodes {
                    let ins: Vec<Value> = g
                        .inputs(x)
                        .into_iter()
                        .map(|v| match map.get(&v) {
                            Some(w) => *w,
                            None => stage_of
                                .get(&v.0)
                                .and_then(|j| current[*j].get(&v))
                                .copied()
                                .unwrap_or(v),
                        })
                        .collect();
                    let node = g.node(x).clone();
                    let name = format!("{} (recompute {})", node.name, runs[stage] - 1);
                    let y = g.add_node(
                        node.op.clone(),
                        &ins,
                        name,
                        Phase::Forward,
                        node.outputs.first(),
                    )?;
                    if ins.iter().any(|v| covered.contains(&v.0)) {
                        covered.insert(y);
                    } else if g.is_kernel(y) && !gate.is_empty() {
                        g.not_before.insert(y, gate.clone());
                        covered.insert(y);
                    }
                    for o in 0..node.outputs.len() {
                        map.insert((x, o), (y, o));
                    }
                }
                current[stage] = map;
            }
            Action::Bwd(i) => {
                for &x in members.get(i).into_iter().flatten() {
                    let edges: Vec<_> =
                        g.g.edges_directed(x, Direction::Incoming)
                            .map(|e| (e.id(), e.source(), *e.weight()))
                            .collect();
                    for (id, src, w) in edges {
                        let v = (src, w.src_output);
                        let Some(j) = stage_of.get(&src) else {
                            continue;
                        };
                        let Some(&nv) = current[*j].get(&v) else {
                            continue;
                        };
                        g.g.remove_edge(id);
                        g.g.add_edge(
                            nv.0,
                            x,
                            Edge {
                                src_output: nv.1,
                                dst_input: w.dst_input,
                            },
                        );
                    }
                }
                let mine: BTreeSet<NodeIndex> = members
                    .get(i)
                    .into_iter()
                    .flatten()
                    .copied()
                    .filter(|x| !waits_for_every_gradient(g, *x))
                    .collect();
                // Waiting for the members that no other member reads is waiting for all of them
                // (each of the others is read, through members, by one of those): the gate stays
                // small (a stage's gate was copied onto every copy of the next stage).
                let mine: BTreeSet<NodeIndex> = mine
                    .iter()
                    .copied()
                    .filter(|x| {
                        !g.g.neighbors_directed(*x, Direction::Outgoing)
                            .any(|c| c != *x && mine.contains(&c))
                    })
                    .collect();
                if !mine.is_empty() {
                    gate = mine;
                    covered.clear();
                }
            }
        }
    }
    Ok(())
}

/// Whether node `x` runs only once every gradient is complete, so that no recomputation may wait
/// for it (it would wait for the backward that needs the recomputation): `clip_norm`'s chain of
/// `GradSqNorm` links and its store, and the updates that read the chain's result (held
/// gradients; the norm pass's updates read a stored leaf instead).
fn waits_for_every_gradient(g: &Graph, x: NodeIndex) -> bool {
    use crate::op::OptimOp;
    match &g.node(x).op {
        Op::Optim(OptimOp::GradSqNorm { .. } | OptimOp::GradNormStore) => true,
        Op::Optim(OptimOp::Update { rule, .. }) if rule.clip_norm().is_some() => g
            .inputs(x)
            .last()
            .is_some_and(|v| !g.node(v.0).op.is_leaf()),
        _ => false,
    }
}

/// A compact description of a strategy: the stage outputs held as checkpoints, and the sequence
/// (`f a-b`: forward of stages a..b keeping only outputs, `F a-b`: forward keeping what the
/// backward reads, `B b-a`: backward), with `names[i]` naming stage `i`.
pub fn describe(acts: &[Action], names: &[String]) -> String {
    let name = |i: usize| names.get(i).cloned().unwrap_or_else(|| i.to_string());
    // Checkpoints: an execution of stage i-1 read by a later execution of stage i that does not
    // directly follow it, and the last of a run of forwards that keep nothing.
    let mut kept: BTreeSet<usize> = BTreeSet::new();
    let mut last: HashMap<usize, usize> = HashMap::new();
    for (p, a) in acts.iter().enumerate() {
        if let Action::Fwd { stage, .. } = *a {
            if stage > 0 {
                if let Some(&q) = last.get(&(stage - 1)) {
                    if q + 1 != p {
                        kept.insert(q);
                    }
                }
            }
            last.insert(stage, p);
        }
        // The last output of a run of forwards that keep nothing is the checkpoint of its branch.
        let next_keeps_nothing = matches!(acts.get(p + 1), Some(Action::Fwd { save: false, .. }));
        if matches!(a, Action::Fwd { save: false, .. }) && !next_keeps_nothing {
            kept.insert(p);
        }
    }
    let ck: Vec<String> = kept
        .iter()
        .filter_map(|q| match acts[*q] {
            Action::Fwd { stage, .. } => Some(name(stage)),
            Action::Bwd(_) => None,
        })
        .collect();
    let mut groups: Vec<(char, usize, usize)> = vec![];
    for a in acts {
        let (k, i) = match *a {
            Action::Fwd { stage, save: false } => ('f', stage),
            Action::Fwd { stage, save: true } => ('F', stage),
            Action::Bwd(i) => ('B', i),
        };
        match groups.last_mut() {
            Some((gk, _, e)) if *gk == k && k != 'B' && *e + 1 == i => *e = i,
            Some((gk, _, e)) if *gk == k && k == 'B' && i + 1 == *e => *e = i,
            _ => groups.push((k, i, i)),
        }
    }
    let seq: Vec<String> = groups
        .iter()
        .map(|(k, a, b)| {
            if a == b {
                format!("{k} {a}")
            } else {
                format!("{k} {a}-{b}")
            }
        })
        .collect();
    format!(
        "checkpoints {}; sequence {}",
        if ck.is_empty() {
            "none".to_string()
        } else {
            ck.join(", ")
        },
        seq.join(" | ")
    )
}
