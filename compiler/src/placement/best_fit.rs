//! Static memory placement: every buffer of a training step gets a fixed offset in ONE arena, so
//! the peak memory of the step is known exactly at compile time.
//!
//! # Problem
//!
//! Each buffer is an [`Interval`]: a size in bytes and an inclusive range of step indices during
//! which it is live. Two buffers whose live ranges overlap in time must not overlap in bytes.
//! Minimising the arena is the NP-hard *dynamic storage allocation* problem, so, like XLA's heap
//! simulator and TFLite's greedy memory planner, we run a fast greedy packer under several
//! orderings and keep the best result.
//!
//! # Algorithm
//!
//! 1. Sizes are rounded up to `align` (an `align` of 0 is treated as 1); zero-byte intervals get
//!    offset 0 and take no space.
//! 2. **Persistent** intervals (parameters, optimizer state) are live at every step and across
//!    steps. They are laid out first, contiguously, at the bottom of the arena, in input order,
//!    which keeps them together for checkpoint IO.
//! 3. **Transient** intervals are packed above them by a *best-fit heap simulation*: intervals
//!    are taken one by one in a given order; for each, the already placed intervals that overlap
//!    it in time are scanned in increasing offset order, the free gaps between them are
//!    enumerated, and the interval goes into the *smallest* gap that fits it (lowest offset on
//!    ties), or, if none fits, right above the highest of them. The placed set is kept sorted by
//!    offset, so each step is one linear scan: `O(n)` per interval, `O(n^2)` per ordering.
//! 4. Several orderings are tried (see [`STRATEGIES`]):
//!    * `size-desc`: largest first (TFLite's "greedy by size"), ties by earlier start;
//!    * `breadth-desc`: TFLite's "greedy by breadth": time steps are visited by decreasing live
//!      bytes, and at each one the still unplaced intervals live there go largest first;
//!    * `area-desc`: by `size * duration`, largest first;
//!    * `duration-desc`: longest-lived first (lifetime-aware: long-lived activations sink to the
//!      bottom, short-lived gradients and temporaries reuse the holes above);
//!    * `start-asc`: in program order (what a best-fit runtime allocator would do);
//!    * `end-asc`: by death time, earliest first.
//!
//! 5. **Bumping** (a small iterated greedy): after each ordering, the intervals that reach the
//!    top of its packing are moved to the front of the order and the simulation is replayed,
//!    for a few rounds, within a work budget that shrinks as `1/n^2` (16 rounds up to ~1,200
//!    intervals, none from ~4,900 on); the best packing seen is kept (`+bump`).
//!
//!    The packing with the smallest arena wins (orderings in this list order on ties) and its
//!    name is reported in [`Placement::strategy`] (see [`VARIANTS`]). The search stops early
//!    once a packing reaches the liveness [`lower_bound`], which is then provably optimal. For
//!    large inputs the orderings after the first run on scoped threads; the result does not
//!    depend on it.
//! 6. **Compaction**: the winner is repacked first-fit, taking the intervals in increasing order
//!    of their current offsets. No interval can move up (each one placed before it ends at or
//!    below its old offset), so the arena never grows; this is repeated a few times while it
//!    shrinks (`+compact`).
//!
//! 7. **Large inputs**: every step above is `O(n^2)` in the number of transient intervals, except
//!    `start-asc`: taken by start, the intervals overlapping the next one are exactly those
//!    still live at its start, so its best-fit simulation is a heap allocator's and runs as a
//!    sweep over time in `O(n log n)`, with the same result. Above [`FULL_SEARCH_MAX_ITEMS`]
//!    transient intervals (a network of thousands of layers) only that ordering runs (no
//!    bumping, no compaction); on training graphs it stays within a fraction of a percent of
//!    the lower bound (a deep transformer: 1.0001), so compilation stays near-linear in the
//!    number of layers.
//!
//! [`check_placement`](super::check_placement) is an independent, deliberately naive (`O(n^2)` pairwise, `u128`
//! arithmetic) validator of the result.
//!
//! Intervals given with `start > end` are treated as spanning `end..=start` by every function
//! here. Byte counts that would overflow `u64` saturate; such a plan can never fit a cap.

use super::{Interval, Placement};

/// The orderings tried by [`best_fit_place`], in order of preference on ties.
pub const STRATEGIES: [&str; 6] = [
    "size-desc",
    "breadth-desc",
    "area-desc",
    "duration-desc",
    "start-asc",
    "end-asc",
];

/// Every name [`Placement::strategy`] can take besides `"trivial"`: for each ordering of
/// [`STRATEGIES`] (same index), the plain ordering, then with critical-interval bumping, with
/// compaction, and with both having improved the arena.
pub const VARIANTS: [[&str; 4]; 6] = [
    [
        "size-desc",
        "size-desc+bump",
        "size-desc+compact",
        "size-desc+bump+compact",
    ],
    [
        "breadth-desc",
        "breadth-desc+bump",
        "breadth-desc+compact",
        "breadth-desc+bump+compact",
    ],
    [
        "area-desc",
        "area-desc+bump",
        "area-desc+compact",
        "area-desc+bump+compact",
    ],
    [
        "duration-desc",
        "duration-desc+bump",
        "duration-desc+compact",
        "duration-desc+bump+compact",
    ],
    [
        "start-asc",
        "start-asc+bump",
        "start-asc+compact",
        "start-asc+bump+compact",
    ],
    [
        "end-asc",
        "end-asc+bump",
        "end-asc+compact",
        "end-asc+bump+compact",
    ],
];

/// Index of `start-asc` in [`STRATEGIES`]: the one ordering [`best_fit`] packs in `O(n log n)`.
const START_ASC: usize = 4;

/// Above this many transient intervals, [`best_fit_place`] packs with `start-asc` alone (see the module
/// docs): every other ordering, bumping and compaction cost `O(n^2)` each.
pub const FULL_SEARCH_MAX_ITEMS: usize = 8_192;

/// At most this many compaction passes after the orderings.
const COMPACTION_PASSES: usize = 3;

/// At most this many bumping rounds per ordering.
const BUMP_MAX_ROUNDS: usize = 16;

/// Work allowed to the bumping rounds of one ordering, counted in (placed interval, new
/// interval) visits of [`best_fit`], about `n^2 / 2` per round: all 16 rounds up to ~1,400
/// transient intervals, 1 round at 4,000, none from ~4,900 on.
const BUMP_WORK: u64 = 12_000_000;

/// How many bumping rounds an ordering of `n` intervals gets.
fn bump_rounds(n: usize) -> usize {
    let per_round = (n as u64).saturating_mul(n as u64) / 2;
    let rounds = BUMP_WORK / per_round.max(1);
    rounds.min(BUMP_MAX_ROUNDS as u64) as usize
}

/// An alignment of 0 means "no alignment".
fn norm_align(align: u64) -> u64 {
    align.max(1)
}

/// `bytes` rounded up to a multiple of `align` (saturating at `u64::MAX`).
pub(super) fn align_up(bytes: u64, align: u64) -> u64 {
    match bytes % align {
        0 => bytes,
        r => bytes.saturating_add(align - r),
    }
}

/// The inclusive live range of a transient interval, normalised so that `lo <= hi`.
fn span(iv: &Interval) -> (usize, usize) {
    (iv.start.min(iv.end), iv.start.max(iv.end))
}

/// Live bytes of the transient intervals `(size, lo, hi)` at each distinct start time, as a
/// sorted list of `(time, live bytes)`. The maximum of live bytes over time is always reached at
/// some start time, so this is enough for the lower bound and for `breadth-desc`.
fn breadth_at_starts(items: &[(u64, usize, usize)]) -> Vec<(usize, u64)> {
    // (time, 0 = birth / 1 = death, size): at equal times births come first, so a buffer dying
    // at `t` and one born at `t` are counted together, as both are live at `t`.
    let mut events: Vec<(usize, u8, u64)> = Vec::with_capacity(items.len() * 2);
    for &(size, lo, hi) in items {
        events.push((lo, 0, size));
        events.push((hi, 1, size));
    }
    events.sort_unstable();
    let mut out: Vec<(usize, u64)> = Vec::new();
    let mut live: u64 = 0;
    for &(t, kind, size) in &events {
        if kind == 0 {
            live = live.saturating_add(size);
            match out.last_mut() {
                Some(last) if last.0 == t => last.1 = live,
                _ => out.push((t, live)),
            }
        } else {
            live = live.saturating_sub(size);
        }
    }
    out
}

/// The liveness lower bound: the maximum over time `t` of the sum of the aligned sizes of the
/// intervals live at `t` (persistent intervals being live at every `t`). No valid placement can
/// have a smaller arena.
pub fn lower_bound(reqs: &[Interval], align: u64) -> u64 {
    let align = norm_align(align);
    let mut persistent: u64 = 0;
    let mut transient = Vec::new();
    for iv in reqs {
        let size = align_up(iv.bytes, align);
        if size == 0 {
            continue;
        }
        if iv.persistent {
            persistent = persistent.saturating_add(size);
        } else {
            let (lo, hi) = span(iv);
            transient.push((size, lo, hi));
        }
    }
    let peak = breadth_at_starts(&transient)
        .iter()
        .map(|&(_, live)| live)
        .max()
        .unwrap_or(0);
    persistent.saturating_add(peak)
}

/// A transient interval to pack: input index, aligned size, normalised live range.
#[derive(Debug, Clone, Copy)]
struct Item {
    idx: usize,
    size: u64,
    lo: usize,
    hi: usize,
}

impl Item {
    fn duration(&self) -> u64 {
        ((self.hi - self.lo) as u64).saturating_add(1)
    }
}

/// An already placed interval of the heap simulation.
#[derive(Debug, Clone, Copy)]
struct Placed {
    off: u64,
    end: u64,
    lo: usize,
    hi: usize,
}

/// Best-fit heap simulation of `items` taken in `order` (first-fit, i.e. the lowest gap that
/// fits, when `first_fit`). Returns the offset of each item (indexed like `items`) and the arena
/// size, both relative to the base of the transient area.
///
/// Each step is one sequential pass over all placed intervals (kept sorted by offset), skipping
/// those not live with the new one. An interval index (segment tree over steps, then sorting
/// the overlapping intervals by offset) was measured 1.5-3x slower on both random and
/// transformer-shaped inputs of 4,000-20,000 intervals: training graphs have most saved
/// activations live together, and the plain pass is cache-friendly.
///
/// When `order` takes the items by non-decreasing start (`start-asc`), the same packing is
/// computed by [`best_fit_in_start_order`] in `O(n log n)`.
fn best_fit(items: &[Item], order: &[usize], first_fit: bool) -> (Vec<u64>, u64) {
    if !first_fit && order.windows(2).all(|w| items[w[0]].lo <= items[w[1]].lo) {
        return best_fit_in_start_order(items, order);
    }
    best_fit_scan(items, order, first_fit)
}

/// [`best_fit`] by scanning every placed interval for each new one: `O(n^2)`.
fn best_fit_scan(items: &[Item], order: &[usize], first_fit: bool) -> (Vec<u64>, u64) {
    let mut offsets = vec![0u64; items.len()];
    // Placed intervals, sorted by offset.
    let mut placed: Vec<Placed> = Vec::with_capacity(items.len());
    let mut arena: u64 = 0;
    for &k in order {
        let it = items[k];
        // `cursor` is the top of the time-overlapping intervals seen so far (in offset order):
        // anything between it and the next overlapping interval's offset is free at all the
        // steps where `it` is live.
        let mut cursor: u64 = 0;
        // (gap size, gap offset) of the best gap found so far.
        let mut best: Option<(u64, u64)> = None;
        for p in &placed {
            if p.hi < it.lo || p.lo > it.hi {
                continue;
            }
            if p.off > cursor {
                let gap = p.off - cursor;
                if gap >= it.size && best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, cursor));
                    if first_fit || gap == it.size {
                        break; // first fit, or a perfect fit that cannot be beaten
                    }
                }
            }
            cursor = cursor.max(p.end);
        }
        let off = best.map_or(cursor, |(_, o)| o);
        let end = off.saturating_add(it.size);
        arena = arena.max(end);
        offsets[k] = off;
        let pos = placed.partition_point(|p| p.off <= off);
        placed.insert(
            pos,
            Placed {
                off,
                end,
                lo: it.lo,
                hi: it.hi,
            },
        );
    }
    (offsets, arena)
}

/// [`best_fit`] (not first-fit) for an `order` that takes the items by non-decreasing start,
/// as a sweep over time in `O(n log n)`; the result is the same, offset for offset.
///
/// Taken by start, the placed intervals that overlap the next one in time are exactly those
/// still live at its start: they are all live together, so they are disjoint in bytes, and the
/// gaps [`best_fit`] enumerates between them are the free blocks of a heap allocator. So the
/// simulation keeps the live blocks (by offset), the free gaps below the top (by size, then
/// offset: the first gap at least as large as the new interval is the smallest one, lowest
/// offset on ties, which is [`best_fit`]'s choice), and the live blocks by end step, freeing
/// (and merging the gaps around) every block that ends before the next start.
fn best_fit_in_start_order(items: &[Item], order: &[usize]) -> (Vec<u64>, u64) {
    use std::cmp::Reverse;
    use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
    let mut offsets = vec![0u64; items.len()];
    let mut arena: u64 = 0;
    // Live blocks: offset -> end. Free gaps between them: (size, offset).
    let mut live: BTreeMap<u64, u64> = BTreeMap::new();
    let mut gaps: BTreeSet<(u64, u64)> = BTreeSet::new();
    // (last live step, offset) of every live block, earliest end first.
    let mut ends: BinaryHeap<Reverse<(usize, u64)>> = BinaryHeap::new();
    for &k in order {
        let it = items[k];
        while let Some(&Reverse((hi, off))) = ends.peek() {
            if hi >= it.lo {
                break;
            }
            ends.pop();
            let Some(end) = live.remove(&off) else {
                continue;
            };
            let prev_end = live.range(..off).next_back().map_or(0, |(_, e)| *e);
            if off > prev_end {
                gaps.remove(&(off - prev_end, prev_end));
            }
            // Without a block above (it was the top one), the space down to `prev_end` joins
            // the free top instead of becoming a gap.
            if let Some(next) = live.range(end..).next().map(|(o, _)| *o) {
                if next > end {
                    gaps.remove(&(next - end, end));
                }
                gaps.insert((next - prev_end, prev_end));
            }
        }
        let top = live.last_key_value().map_or(0, |(_, e)| *e);
        let off = match gaps.range((it.size, 0)..).next().copied() {
            Some((size, off)) => {
                gaps.remove(&(size, off));
                if size > it.size {
                    gaps.insert((size - it.size, off + it.size));
                }
                off
            }
            None => top,
        };
        let end = off.saturating_add(it.size);
        arena = arena.max(end);
        offsets[k] = off;
        live.insert(off, end);
        ends.push(Reverse((it.hi, off)));
    }
    (offsets, arena)
}

/// The order in which `strategy` (one of [`STRATEGIES`]) packs `items`. Every ordering breaks
/// its remaining ties by input index, so the result is deterministic.
fn ordering(strategy: &str, items: &[Item]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    // The keys are computed once per item, not at every comparison; (key, index) pairs are
    // distinct, so an unstable sort gives the same order as a stable one.
    let by = |key: &dyn Fn(&Item) -> (u128, u128, u128)| {
        let mut keyed: Vec<((u128, u128, u128), usize)> = items
            .iter()
            .enumerate()
            .map(|(k, it)| (key(it), k))
            .collect();
        keyed.sort_unstable();
        keyed.into_iter().map(|(_, k)| k).collect::<Vec<usize>>()
    };
    // Keys are sorted ascending; "descending" keys are stored as `MAX - value`.
    let desc = |v: u128| u128::MAX - v;
    match strategy {
        "size-desc" => {
            order = by(&|it| {
                (
                    desc(it.size as u128),
                    it.lo as u128,
                    desc(it.duration() as u128),
                )
            })
        }
        "area-desc" => {
            order = by(&|it| {
                (
                    desc(it.size as u128 * it.duration() as u128),
                    desc(it.size as u128),
                    it.lo as u128,
                )
            })
        }
        "duration-desc" => {
            order = by(&|it| {
                (
                    desc(it.duration() as u128),
                    desc(it.size as u128),
                    it.lo as u128,
                )
            })
        }
        "start-asc" => {
            order = by(&|it| (it.lo as u128, desc(it.size as u128), desc(it.hi as u128)))
        }
        "end-asc" => order = by(&|it| (it.hi as u128, desc(it.size as u128), it.lo as u128)),
        "breadth-desc" => {
            // Visiting time steps by decreasing breadth and, at each, the unplaced live
            // intervals by decreasing size is the same as sorting intervals by (the largest
            // breadth over their life, the earliest step reaching it, decreasing size).
            let triples: Vec<(u64, usize, usize)> =
                items.iter().map(|it| (it.size, it.lo, it.hi)).collect();
            let breadth = breadth_at_starts(&triples);
            let table = RangeMax::new(&breadth);
            let key: Vec<(u128, u128, u128)> = items
                .iter()
                .map(|it| {
                    // Breadth over the life of `it` peaks at some start time in [lo, hi]; there
                    // is at least one (its own).
                    let a = breadth.partition_point(|&(t, _)| t < it.lo);
                    let b = breadth.partition_point(|&(t, _)| t <= it.hi);
                    let (live, at) = table.query(a, b.max(a + 1));
                    (desc(live as u128), at as u128, desc(it.size as u128))
                })
                .collect();
            order.sort_by_key(|&k| (key[k], k));
        }
        _ => {}
    }
    order
}

/// Sparse table for "largest breadth (and its earliest position) in a range" queries.
struct RangeMax {
    /// `levels[j][i]` = best of positions `i .. i + 2^j`, as `(breadth, position)`.
    levels: Vec<Vec<(u64, usize)>>,
}

impl RangeMax {
    fn new(breadth: &[(usize, u64)]) -> Self {
        let mut levels = vec![breadth
            .iter()
            .enumerate()
            .map(|(i, &(_, b))| (b, i))
            .collect::<Vec<_>>()];
        let mut width = 1;
        while width * 2 <= breadth.len() {
            let prev = &levels[levels.len() - 1];
            let next = (0..=breadth.len() - width * 2)
                .map(|i| Self::better(prev[i], prev[i + width]))
                .collect();
            levels.push(next);
            width *= 2;
        }
        RangeMax { levels }
    }

    /// Larger breadth wins; on ties the earlier position.
    fn better(a: (u64, usize), b: (u64, usize)) -> (u64, usize) {
        if b.0 > a.0 || (b.0 == a.0 && b.1 < a.1) {
            b
        } else {
            a
        }
    }

    /// Best over positions `a..b` (`a < b <= len`).
    fn query(&self, a: usize, b: usize) -> (u64, usize) {
        let len = b - a;
        let j = (usize::BITS - 1 - len.leading_zeros()) as usize;
        let level = &self.levels[j];
        Self::better(level[a], level[b - (1 << j)])
    }
}

/// The best packing found from one ordering.
struct Packing {
    /// Index of the ordering in [`STRATEGIES`].
    strategy: usize,
    offsets: Vec<u64>,
    arena: u64,
    /// Whether bumping improved on the plain ordering.
    bumped: bool,
}

/// Packs `items` with ordering `strategy` (an index in [`STRATEGIES`]), then runs up to
/// [`bump_rounds`] rounds of *critical-interval bumping*: the intervals reaching the top of the
/// last packing are moved to the front of the order (keeping their relative order) and the
/// simulation is replayed. This is a small iterated greedy: the intervals that made the peak
/// get first pick of the space, the others fit around them. The last packing is kept even when
/// worse (so the walk can leave a local minimum); the best one seen is returned. Stops early at
/// `bound` (optimal), or when the order no longer changes.
fn pack(items: &[Item], strategy: usize, bound: u64) -> Packing {
    let mut order = ordering(STRATEGIES[strategy], items);
    let (offsets, arena) = best_fit(items, &order, false);
    let mut best = Packing {
        strategy,
        offsets: offsets.clone(),
        arena,
        bumped: false,
    };
    let (mut cur_offsets, mut cur_arena) = (offsets, arena);
    for _ in 0..bump_rounds(items.len()) {
        if best.arena <= bound {
            break;
        }
        let (critical, rest): (Vec<usize>, Vec<usize>) = order
            .iter()
            .partition(|&&k| cur_offsets[k].saturating_add(items[k].size) >= cur_arena);
        if order[..critical.len()] == critical[..] {
            break; // already in front: replaying would give the same packing
        }
        order = critical.into_iter().chain(rest).collect();
        (cur_offsets, cur_arena) = best_fit(items, &order, false);
        if cur_arena < best.arena {
            best.offsets.clone_from(&cur_offsets);
            best.arena = cur_arena;
            best.bumped = true;
        }
    }
    best
}

/// Below this many transient intervals the orderings are run one after the other.
const PARALLEL_MIN_ITEMS: usize = 1024;

/// Packs with the orderings after the first one, in [`STRATEGIES`] order: sequentially for
/// small inputs (stopping at the first one reaching `bound`, which is optimal), else on scoped
/// threads (falling back to the calling thread if one cannot be spawned). The results are the
/// same either way, up to the orderings skipped after reaching the bound.
fn pack_rest(items: &[Item], bound: u64) -> Vec<Packing> {
    let rest = 1..STRATEGIES.len();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if items.len() < PARALLEL_MIN_ITEMS || threads < 2 {
        let mut out = Vec::new();
        for strategy in rest {
            let r = pack(items, strategy, bound);
            let done = r.arena <= bound;
            out.push(r);
            if done {
                break;
            }
        }
        return out;
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = rest
            .map(|strategy| {
                let h = std::thread::Builder::new()
                    .spawn_scoped(scope, move || pack(items, strategy, bound));
                (strategy, h)
            })
            .collect();
        handles
            .into_iter()
            .map(|(strategy, h)| match h {
                Ok(h) => h.join().unwrap_or_else(|_| pack(items, strategy, bound)),
                Err(_) => pack(items, strategy, bound),
            })
            .collect()
    })
}

/// Plans every interval into one arena (see the module documentation for the algorithm).
///
/// Offsets are multiples of `align` (0 means 1); persistent intervals are contiguous at the
/// bottom of the arena in input order; zero-byte intervals get offset 0.
pub fn best_fit_place(reqs: &[Interval], align: u64) -> Placement {
    let align = norm_align(align);
    let mut offsets = vec![0u64; reqs.len()];

    // Persistent intervals first, contiguous at the bottom.
    let mut base: u64 = 0;
    let mut items: Vec<Item> = Vec::new();
    for (idx, iv) in reqs.iter().enumerate() {
        let size = align_up(iv.bytes, align);
        if size == 0 {
            continue;
        }
        if iv.persistent {
            offsets[idx] = base;
            base = base.saturating_add(size);
        } else {
            let (lo, hi) = span(iv);
            items.push(Item { idx, size, lo, hi });
        }
    }

    let lower = lower_bound(reqs, align);
    let transient_bound = lower.saturating_sub(base);

    // Transient intervals: best of the orderings.
    let mut strategy = "trivial";
    let mut best: Option<(Vec<u64>, u64)> = None;
    if items.len() > FULL_SEARCH_MAX_ITEMS {
        // Large inputs: start-asc alone, by the O(n log n) sweep (no bumping, no compaction).
        let r = pack(&items, START_ASC, transient_bound);
        best = Some((r.offsets, r.arena));
        strategy = VARIANTS[START_ASC][usize::from(r.bumped)];
    } else if !items.is_empty() {
        // The first ordering alone: on typical training graphs it already reaches the bound.
        let mut results = vec![pack(&items, 0, transient_bound)];
        if results[0].arena > transient_bound {
            results.extend(pack_rest(&items, transient_bound));
        }
        // Smallest arena wins; `results` is in STRATEGIES order, so the earliest on ties.
        let mut winner = (0, false);
        for r in results {
            if best.as_ref().is_none_or(|(_, a)| r.arena < *a) {
                best = Some((r.offsets, r.arena));
                winner = (r.strategy, r.bumped);
            }
        }
        let mut compacted = false;
        // Compaction: repacking first-fit in increasing order of the current offsets never
        // moves an interval up (every earlier one ends at or below its old offset), and often
        // closes holes. Repeat while it helps.
        for _ in 0..COMPACTION_PASSES {
            let Some((offs, arena)) = best.as_ref() else {
                break;
            };
            if *arena <= transient_bound {
                break;
            }
            let mut order: Vec<usize> = (0..items.len()).collect();
            order.sort_by_key(|&k| (offs[k], k));
            let (new_offs, new_arena) = best_fit(&items, &order, true);
            if new_arena >= *arena {
                break;
            }
            best = Some((new_offs, new_arena));
            compacted = true;
        }
        strategy = VARIANTS[winner.0][usize::from(winner.1) + 2 * usize::from(compacted)];
    }
    let (rel, transient_arena) = best.unwrap_or_default();
    for (it, off) in items.iter().zip(rel) {
        offsets[it.idx] = base.saturating_add(off);
    }
    let arena_bytes = base.saturating_add(transient_arena);

    Placement {
        offsets,
        arena_bytes,
        lower_bound: lower,
        strategy,
    }
}

/// The transient items of `reqs` (non-empty, not persistent), sizes aligned to `align`.
fn transient_items(reqs: &[Interval], align: u64) -> Vec<Item> {
    let align = norm_align(align);
    reqs.iter()
        .enumerate()
        .filter(|(_, r)| !r.persistent && r.bytes > 0)
        .map(|(idx, r)| {
            let (lo, hi) = span(r);
            Item {
                idx,
                size: align_up(r.bytes, align),
                lo,
                hi,
            }
        })
        .collect()
}

/// The arena of the transient intervals of `reqs` packed best-fit in ordering `strategy` (one of
/// [`STRATEGIES`]) alone, without bumping or compaction: what the portfolio of
/// [`best_fit_place`] buys over each ordering (for tests and measurements).
pub fn ordering_arena(reqs: &[Interval], align: u64, strategy: &str) -> u64 {
    let items = transient_items(reqs, align);
    best_fit(&items, &ordering(strategy, &items), false).1
}

#[cfg(test)]
mod tests {
    //! The internals' own properties (the public behaviour is tested in
    //! `compiler/tests/it/placement.rs`).
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn start_asc_index() {
        assert_eq!(STRATEGIES[START_ASC], "start-asc");
    }

    fn arb_interval() -> impl Strategy<Value = Interval> {
        (
            prop_oneof![Just(0u64), 1u64..100, 1u64..100_000],
            0usize..200,
            prop_oneof![0usize..5, 0usize..60],
            prop::bool::weighted(0.1),
        )
            .prop_map(|(bytes, start, len, persistent)| Interval {
                bytes,
                start,
                end: start + len,
                persistent,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// The sweep computes the scan's best-fit packing exactly, for every order by start
        /// (ties included, in any order among themselves).
        #[test]
        fn prop_sweep_is_the_scan_in_start_order(
            reqs in prop::collection::vec(arb_interval(), 0..300),
            tie_keys in prop::collection::vec(0u64..4, 300),
        ) {
            let items: Vec<Item> = reqs
                .iter()
                .enumerate()
                .filter(|(_, iv)| iv.bytes > 0)
                .map(|(idx, iv)| {
                    let (lo, hi) = span(iv);
                    Item { idx, size: align_up(iv.bytes, 8), lo, hi }
                })
                .collect();
            let mut order: Vec<usize> = (0..items.len()).collect();
            order.sort_by_key(|&k| (items[k].lo, tie_keys[k]));
            prop_assert_eq!(
                best_fit_in_start_order(&items, &order),
                best_fit_scan(&items, &order, false)
            );
            let start_asc = ordering("start-asc", &items);
            prop_assert_eq!(
                best_fit(&items, &start_asc, false),
                best_fit_scan(&items, &start_asc, false)
            );
        }
    }
}
