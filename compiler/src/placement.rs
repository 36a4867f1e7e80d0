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
//! [`check_placement`] is an independent, deliberately naive (`O(n^2)` pairwise, `u128`
//! arithmetic) validator of the result.
//!
//! Intervals given with `start > end` are treated as spanning `end..=start` by every function
//! here. Byte counts that would overflow `u64` saturate; such a plan can never fit a cap.

use thiserror::Error;

/// One buffer to place: its size and its inclusive live range in step indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Interval {
    /// Size in bytes (rounded up to the alignment for packing).
    pub bytes: u64,
    /// First step at which the buffer is live.
    pub start: usize,
    /// Last step at which the buffer is live (inclusive).
    pub end: usize,
    /// Live for the whole step and across steps (parameters, optimizer state); `start`/`end` are
    /// then ignored.
    pub persistent: bool,
}

/// The result of [`place`]: an offset per interval, in the order of the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Byte offset of each interval in the arena (0 for zero-byte intervals).
    pub offsets: Vec<u64>,
    /// Arena size: the maximum over intervals of `offset + aligned size`.
    pub arena_bytes: u64,
    /// The liveness lower bound (see [`lower_bound`]); no placement can use less.
    pub lower_bound: u64,
    /// How this placement was found: one of [`VARIANTS`] (an ordering of [`STRATEGIES`], maybe
    /// improved by bumping and/or compaction), or `"trivial"` when there was no transient
    /// interval to pack.
    pub strategy: &'static str,
}

/// Why [`place`] failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PlaceError {
    /// The best placement found needs more than the memory cap.
    #[error(
        "memory plan needs {needed} bytes but the cap is {cap} bytes \
         (no plan can go below the liveness lower bound of {lower_bound} bytes)"
    )]
    CapExceeded {
        /// Arena size of the best placement found.
        needed: u64,
        /// The cap that was asked for.
        cap: u64,
        /// The liveness lower bound: if it is above `cap`, no placement can fit.
        lower_bound: u64,
    },
}

/// The orderings tried by [`place`], in order of preference on ties.
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

/// Above this many transient intervals, [`place`] packs with `start-asc` alone (see the module
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
fn align_up(bytes: u64, align: u64) -> u64 {
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
    let by = |key: &dyn Fn(&Item) -> (u128, u128, u128)| {
        let mut o = order.clone();
        o.sort_by_key(|&k| (key(&items[k]), k));
        o
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
/// bottom of the arena in input order; zero-byte intervals get offset 0. If `cap` is given and
/// the best arena found exceeds it, returns [`PlaceError::CapExceeded`].
pub fn place(reqs: &[Interval], align: u64, cap: Option<u64>) -> Result<Placement, PlaceError> {
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

    if let Some(cap) = cap {
        if arena_bytes > cap {
            return Err(PlaceError::CapExceeded {
                needed: arena_bytes,
                cap,
                lower_bound: lower,
            });
        }
    }
    Ok(Placement {
        offsets,
        arena_bytes,
        lower_bound: lower,
        strategy,
    })
}

/// Independently checks a placement: one offset per interval, every offset a multiple of
/// `align`, zero-byte intervals at offset 0, every interval inside the arena, no two intervals
/// that are live at a common step (persistent ones are live at every step) sharing a byte, and
/// `lower_bound <= arena_bytes`. Uses plain pairwise comparisons in `u128`, sharing no code
/// with [`place`].
pub fn check_placement(reqs: &[Interval], p: &Placement, align: u64) -> Result<(), String> {
    if p.offsets.len() != reqs.len() {
        return Err(format!(
            "{} offsets for {} intervals",
            p.offsets.len(),
            reqs.len()
        ));
    }
    let align = u128::from(align.max(1));
    let arena = u128::from(p.arena_bytes);
    if u128::from(p.lower_bound) > arena {
        return Err(format!(
            "lower bound {} above the arena size {}",
            p.lower_bound, p.arena_bytes
        ));
    }
    // (offset, aligned size, first step, last step, persistent)
    let mut boxes: Vec<(usize, u128, u128, usize, usize, bool)> = Vec::new();
    for (i, (iv, &off)) in reqs.iter().zip(&p.offsets).enumerate() {
        let off = u128::from(off);
        let size = u128::from(iv.bytes).div_ceil(align) * align;
        if size == 0 {
            if off != 0 {
                return Err(format!("zero-byte interval {i} at offset {off}, not 0"));
            }
            continue;
        }
        if off % align != 0 {
            return Err(format!(
                "interval {i} at offset {off} not aligned to {align}"
            ));
        }
        if off + size > arena {
            return Err(format!(
                "interval {i} spans [{off}, {}) beyond the arena of {arena} bytes",
                off + size
            ));
        }
        let (a, b) = (iv.start.min(iv.end), iv.start.max(iv.end));
        boxes.push((i, off, size, a, b, iv.persistent));
    }
    for (x, &(i, oi, si, ai, bi, pi)) in boxes.iter().enumerate() {
        for &(j, oj, sj, aj, bj, pj) in &boxes[x + 1..] {
            let in_time = pi || pj || (ai <= bj && aj <= bi);
            let in_bytes = oi < oj + sj && oj < oi + si;
            if in_time && in_bytes {
                return Err(format!(
                    "intervals {i} (bytes [{oi}, {}), steps {ai}..={bi}{}) and {j} (bytes \
                     [{oj}, {}), steps {aj}..={bj}{}) are live together and overlap",
                    oi + si,
                    if pi { ", persistent" } else { "" },
                    oj + sj,
                    if pj { ", persistent" } else { "" },
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn iv(bytes: u64, start: usize, end: usize) -> Interval {
        Interval {
            bytes,
            start,
            end,
            persistent: false,
        }
    }

    fn param(bytes: u64) -> Interval {
        Interval {
            bytes,
            start: 0,
            end: 0,
            persistent: true,
        }
    }

    /// Places, checks, and returns the placement.
    fn place_ok(reqs: &[Interval], align: u64) -> Placement {
        let p = place(reqs, align, None).expect("no cap");
        check_placement(reqs, &p, align).expect("valid placement");
        assert!(p.arena_bytes >= p.lower_bound);
        assert_eq!(p.lower_bound, lower_bound(reqs, align));
        p
    }

    #[test]
    fn start_asc_index() {
        assert_eq!(STRATEGIES[START_ASC], "start-asc");
    }

    #[test]
    fn large_inputs_are_packed_start_asc() {
        // A chain-shaped step with more transient intervals than the full search takes:
        // activations kept until their backward, short-lived gradients.
        let l = FULL_SEARCH_MAX_ITEMS;
        let mut reqs = vec![];
        for i in 0..l {
            reqs.push(iv(1024, i, 2 * l - i));
            reqs.push(iv(512, 2 * l - i, 2 * l - i + 1));
        }
        let p = place_ok(&reqs, 64);
        assert_eq!(p.strategy, "start-asc");
        assert_eq!(p.arena_bytes, p.lower_bound);
    }

    #[test]
    fn empty() {
        let p = place_ok(&[], 64);
        assert_eq!(p.arena_bytes, 0);
        assert_eq!(p.lower_bound, 0);
        assert_eq!(p.strategy, "trivial");
    }

    #[test]
    fn zero_bytes_take_no_space() {
        let reqs = [iv(0, 0, 5), iv(10, 0, 5), iv(0, 3, 3), param(0)];
        let p = place_ok(&reqs, 16);
        assert_eq!(p.offsets, vec![0, 0, 0, 0]);
        assert_eq!(p.arena_bytes, 16);
        assert_eq!(p.lower_bound, 16);
    }

    #[test]
    fn sizes_are_aligned() {
        let reqs = [iv(1, 0, 1), iv(17, 1, 2), iv(33, 0, 2)];
        let p = place_ok(&reqs, 16);
        assert!(p.offsets.iter().all(|o| o % 16 == 0));
        // 16 + 32 live at step 1 plus 48: lower bound 96.
        assert_eq!(p.lower_bound, 96);
        assert_eq!(p.arena_bytes, 96);
        // align 0 behaves like align 1
        let p = place_ok(&reqs, 0);
        assert_eq!(p.arena_bytes, 51);
    }

    #[test]
    fn disjoint_lifetimes_share_memory() {
        let reqs = [iv(100, 0, 1), iv(100, 2, 3), iv(100, 4, 5)];
        let p = place_ok(&reqs, 1);
        assert_eq!(p.arena_bytes, 100);
        assert_eq!(p.offsets, vec![0, 0, 0]);
        // Inclusive ends: [0,1] and [1,2] overlap at step 1.
        let reqs = [iv(100, 0, 1), iv(100, 1, 2)];
        let p = place_ok(&reqs, 1);
        assert_eq!(p.arena_bytes, 200);
    }

    #[test]
    fn extreme_steps_and_sizes() {
        let reqs = [
            iv(8, usize::MAX - 1, usize::MAX),
            iv(8, 0, usize::MAX),
            iv(8, usize::MAX, usize::MAX),
            iv(u64::MAX / 4, 3, 3),
        ];
        let p = place_ok(&reqs, 8);
        assert_eq!(p.lower_bound, u64::MAX / 4 + 1 + 8);
        assert_eq!(p.arena_bytes, p.lower_bound);
        let p = place_ok(&reqs, 1 << 40);
        assert!(p.offsets.iter().all(|o| o % (1 << 40) == 0));
    }

    #[test]
    fn reversed_interval_is_normalised() {
        let reqs = [iv(8, 5, 2), iv(8, 3, 3)];
        let p = place_ok(&reqs, 8);
        assert_eq!(p.arena_bytes, 16);
        assert_eq!(p.lower_bound, 16);
    }

    #[test]
    fn persistent_first_and_contiguous() {
        let reqs = [
            iv(50, 0, 3),
            param(30),
            iv(50, 4, 6),
            param(10),
            param(0),
            param(64),
        ];
        let p = place_ok(&reqs, 8);
        // params in input order at the bottom: 32 + 16 + 64 = 112
        assert_eq!(p.offsets[1], 0);
        assert_eq!(p.offsets[3], 32);
        assert_eq!(p.offsets[5], 48);
        assert_eq!(p.offsets[0], 112);
        assert_eq!(p.offsets[2], 112);
        assert_eq!(p.arena_bytes, 112 + 56);
        assert_eq!(p.lower_bound, 112 + 56);
    }

    #[test]
    fn persistent_overlaps_everything() {
        // A persistent interval conflicts with a transient one at any step.
        let reqs = [param(16), iv(16, 100, 200)];
        let p = place_ok(&reqs, 16);
        assert_eq!(p.arena_bytes, 32);
        let bad = Placement {
            offsets: vec![0, 0],
            arena_bytes: 16,
            lower_bound: 16,
            strategy: "hand",
        };
        assert!(check_placement(&reqs, &bad, 16).is_err());
    }

    #[test]
    fn best_fit_picks_smallest_gap() {
        // After a (0..100 bytes, steps 0..=9), gap [100, 150) (b dies early) ,
        // c above: the smallest gap that fits a 40-byte buffer is chosen.
        let reqs = [
            iv(100, 0, 9), // a
            iv(50, 0, 1),  // b: frees [100,150) after step 1
            iv(200, 0, 9), // c
            iv(40, 5, 6),  // d: fits in b's hole
        ];
        let p = place_ok(&reqs, 1);
        assert_eq!(p.arena_bytes, 350);
    }

    #[test]
    fn cap() {
        let reqs = [iv(100, 0, 1), iv(100, 1, 2), param(28)];
        let p = place(&reqs, 1, Some(228)).expect("fits exactly");
        assert_eq!(p.arena_bytes, 228);
        let e = place(&reqs, 1, Some(227)).unwrap_err();
        assert_eq!(
            e,
            PlaceError::CapExceeded {
                needed: 228,
                cap: 227,
                lower_bound: 228
            }
        );
        let msg = e.to_string();
        assert!(msg.contains("228") && msg.contains("227"), "{msg}");
    }

    #[test]
    fn checker_rejects_bad_placements() {
        let reqs = [iv(10, 0, 3), iv(10, 2, 5), iv(10, 6, 7)];
        let good = Placement {
            offsets: vec![0, 16, 0],
            arena_bytes: 32,
            lower_bound: 32,
            strategy: "hand",
        };
        check_placement(&reqs, &good, 16).expect("good one passes");

        let mut bad = good.clone();
        bad.offsets = vec![0, 8, 0]; // overlap in bytes while both live at steps 2..=3
        let e = check_placement(&reqs, &bad, 8).unwrap_err();
        assert!(e.contains("overlap"), "{e}");

        let mut bad = good.clone();
        bad.offsets = vec![0, 24, 0]; // misaligned for 16
        let e = check_placement(&reqs, &bad, 16).unwrap_err();
        assert!(e.contains("aligned"), "{e}");

        let mut bad = good.clone();
        bad.arena_bytes = 31; // last interval pokes out of the arena
        bad.lower_bound = 31;
        let e = check_placement(&reqs, &bad, 16).unwrap_err();
        assert!(e.contains("beyond"), "{e}");

        let mut bad = good.clone();
        bad.offsets = vec![0, 16];
        assert!(check_placement(&reqs, &bad, 16).is_err());

        let mut bad = good.clone();
        bad.lower_bound = 33;
        assert!(check_placement(&reqs, &bad, 16).is_err());

        // Overlap in bytes is fine when the lifetimes are disjoint, but not when they touch at
        // an inclusive end.
        let mut ok = good.clone();
        ok.offsets = vec![0, 16, 16];
        check_placement(&reqs, &ok, 16).expect("interval 2 dies-born disjoint from 1");
        let reqs2 = [iv(10, 0, 3), iv(10, 3, 5)];
        let touch = Placement {
            offsets: vec![0, 0],
            arena_bytes: 16,
            lower_bound: 16,
            strategy: "hand",
        };
        assert!(check_placement(&reqs2, &touch, 16).is_err());

        // Zero-byte intervals must sit at 0.
        let reqs3 = [iv(0, 0, 1)];
        let z = Placement {
            offsets: vec![16],
            arena_bytes: 16,
            lower_bound: 0,
            strategy: "hand",
        };
        assert!(check_placement(&reqs3, &z, 16).is_err());
    }

    // ---------------------------------------------------------------- realistic patterns

    /// A training-step liveness builder: step counter plus intervals.
    #[derive(Default)]
    struct Trace {
        reqs: Vec<Interval>,
    }

    impl Trace {
        fn buf(&mut self, bytes: u64, start: usize, end: usize) -> usize {
            self.reqs.push(iv(bytes, start, end));
            self.reqs.len() - 1
        }
        fn param(&mut self, bytes: u64) {
            self.reqs.push(param(bytes));
        }
    }

    /// Places a pattern, checks it, prints arena / lower bound, both overall and for the
    /// transient part alone (the persistent bottom is always exact), and returns the larger.
    fn ratio(name: &str, reqs: &[Interval], align: u64) -> f64 {
        let p = place_ok(reqs, align);
        let base: u64 = reqs
            .iter()
            .filter(|r| r.persistent)
            .map(|r| r.bytes.div_ceil(align) * align)
            .sum();
        let r = p.arena_bytes as f64 / p.lower_bound as f64;
        let rt = (p.arena_bytes - base) as f64 / (p.lower_bound - base) as f64;
        println!(
            "{name}: n={} arena={} lower_bound={} ratio={r:.4} transient-ratio={rt:.4} \
             strategy={}",
            reqs.len(),
            p.arena_bytes,
            p.lower_bound,
            p.strategy
        );
        // Each ordering alone (transient part), to show what the portfolio buys.
        let items: Vec<Item> = reqs
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.persistent && r.bytes > 0)
            .map(|(idx, r)| Item {
                idx,
                size: r.bytes.div_ceil(align) * align,
                lo: r.start.min(r.end),
                hi: r.start.max(r.end),
            })
            .collect();
        let each: Vec<String> = STRATEGIES
            .iter()
            .map(|&name| {
                let (_, a) = best_fit(&items, &ordering(name, &items), false);
                format!("{name}={:.4}", a as f64 / (p.lower_bound - base) as f64)
            })
            .collect();
        println!("    alone: {}", each.join(" "));
        r.max(rt)
    }

    /// `L`-layer chain with activations of `sizes[i]` (output of layer i, i = 0 is the input):
    /// forward step i computes act[i+1] from act[i]; backward of layer i (step 2L-1-i) uses
    /// act[i] (and act[i+1] for the ReLU mask) and turns grad[i+1] into grad[i], plus a
    /// short-lived weight gradient consumed by the fused optimizer update. Per-layer weights and
    /// optimizer state are persistent.
    fn chain(sizes: &[u64], weights: &[u64], temp: bool) -> Vec<Interval> {
        let l = sizes.len() - 1;
        let bwd = |i: usize| 2 * l - 1 - i; // step of the backward of layer i
        let mut t = Trace::default();
        for &w in weights {
            t.param(w); // weights
            t.param(2 * w); // Adam moments
        }
        // act[0] is the input batch, read by the backward of layer 0.
        t.buf(sizes[0], 0, bwd(0));
        for i in 0..l {
            // act[i+1], produced at forward step i, read by the backward of layer i+1 (as its
            // input) and last by the backward of layer i (ReLU mask).
            t.buf(sizes[i + 1], i, bwd(i));
            if temp {
                // a forward scratch buffer (im2col / workspace) of the layer
                t.buf(sizes[i] / 2 + 7, i, i);
            }
        }
        // grad[l] (loss gradient) born at the first backward step.
        t.buf(sizes[l], bwd(l - 1), bwd(l - 1));
        for i in (0..l).rev() {
            // grad[i] born at bwd(i), consumed by bwd(i-1).
            let end = if i > 0 { bwd(i - 1) } else { bwd(0) };
            t.buf(sizes[i], bwd(i), end);
            // weight gradient, consumed within the same step by the optimizer update
            if let Some(&w) = weights.get(i) {
                t.buf(w, bwd(i), bwd(i));
            }
            if temp {
                t.buf(sizes[i + 1] / 3 + 5, bwd(i), bwd(i));
            }
        }
        t.reqs
    }

    #[test]
    fn realistic_chain_equal_sizes() {
        let sizes = vec![1 << 20; 17];
        let weights = vec![1 << 16; 16];
        let r = ratio("chain16-equal", &chain(&sizes, &weights, false), 256);
        assert!(r <= 1.02, "ratio {r}");
        let r = ratio("chain16-equal-noparams", &chain(&sizes, &[], false), 256);
        assert!(r <= 1.02, "ratio {r}");
    }

    #[test]
    fn realistic_convnet_with_pools() {
        // VGG-like: 224x224 input, channel doubling and 2x2 pooling every few layers, f32,
        // batch 8. Pools make separate (smaller) activations.
        let mut sizes = vec![8 * 3 * 224 * 224 * 4u64];
        let mut weights = Vec::new();
        let (mut c, mut hw) = (3u64, 224u64);
        for (block, convs) in [2usize, 2, 3, 3, 3].into_iter().enumerate() {
            let out = 64u64 << block.min(3);
            for _ in 0..convs {
                weights.push(out * c * 9 * 4 + 13);
                c = out;
                sizes.push(8 * c * hw * hw * 4);
            }
            hw /= 2; // pool
            weights.push(0);
            sizes.push(8 * c * hw * hw * 4);
        }
        let reqs = chain(&sizes, &weights, false);
        let r = ratio("convnet-pools", &reqs, 64);
        assert!(r <= 1.02, "ratio {r}");
        let reqs = chain(&sizes, &weights, true);
        let r = ratio("convnet-pools-scratch", &reqs, 64);
        assert!(r <= 1.02, "ratio {r}");
    }

    /// ResNet-like (basic blocks): `x -> conv -> bn+relu -> conv -> (+ skip) -> relu`, the
    /// skip being a 1x1 strided projection at the first block of every stage but the first.
    /// `stages` gives the blocks per stage (ResNet-18: `[2, 2, 2, 2]`, ResNet-34:
    /// `[3, 4, 6, 3]`).
    fn resnet(stages: &[usize], batch: u64) -> Vec<Interval> {
        let act = |c: u64, hw: u64| batch * c * hw * hw * 4;
        let mut tp = Tape::default();
        let (mut c, mut hw) = (64u64, 56u64);
        let img = tp.op(batch * 3 * 224 * 224 * 4, &[], &[], 0);
        let mut x = tp.op(act(c, hw), &[img], &[img], 7 * 7 * 3 * c * 4); // stem (+ pool)
        for (stage, &blocks) in stages.iter().enumerate() {
            for block in 0..blocks {
                let c_in = c;
                let down = stage > 0 && block == 0;
                if down {
                    c *= 2;
                    hw /= 2;
                }
                let h1 = tp.op(act(c, hw), &[x], &[x], 9 * c_in * c * 4);
                let r1 = tp.op(act(c, hw), &[h1], &[], 2 * c * 4);
                tp.saved[r1].push(r1); // relu backward reads its output
                let h2 = tp.op(act(c, hw), &[r1], &[r1], 9 * c * c * 4);
                let skip = if down {
                    tp.op(act(c, hw), &[x], &[x], c_in * c * 4)
                } else {
                    x
                };
                let sum = tp.op(act(c, hw), &[h2, skip], &[], 0);
                x = tp.op(act(c, hw), &[sum], &[], 0);
                tp.saved[x].push(x);
            }
        }
        let pooled = tp.op(batch * c * 4, &[x], &[], 0);
        let logits = tp.op(batch * 1000 * 4, &[pooled], &[pooled], c * 1000 * 4);
        tp.op(4, &[logits], &[logits], 0); // loss
        tp.liveness()
    }

    #[test]
    fn realistic_residual() {
        for (name, stages, batch) in [
            ("resnet18-b32", &[2usize, 2, 2, 2][..], 32),
            ("resnet34-b8", &[3, 4, 6, 3][..], 8),
            ("resnet-deep-b3", &[8, 8, 8][..], 3),
        ] {
            let r = ratio(name, &resnet(stages, batch), 256);
            assert!(r <= 1.02, "ratio {r}");
        }
    }

    /// A reverse-mode autodiff tape: op `k` runs forward at step `k` and produces tensor `k`;
    /// its backward runs at step `2K - 1 - k`, reads the tensors it saved and the gradient of
    /// its output, and produces the gradients of its inputs (accumulated in place) and a
    /// short-lived weight gradient.
    #[derive(Default)]
    struct Tape {
        sizes: Vec<u64>,
        inputs: Vec<Vec<usize>>,
        saved: Vec<Vec<usize>>,
        wgrad: Vec<u64>,
        params: Vec<u64>,
    }

    impl Tape {
        fn op(&mut self, size: u64, inputs: &[usize], saved: &[usize], weight: u64) -> usize {
            self.sizes.push(size);
            self.inputs.push(inputs.to_vec());
            self.saved.push(saved.to_vec());
            self.wgrad.push(weight);
            if weight > 0 {
                self.params.push(weight); // weights
                self.params.push(2 * weight); // optimizer moments
            }
            self.sizes.len() - 1
        }

        fn liveness(&self) -> Vec<Interval> {
            let k = self.sizes.len();
            let bwd = |op: usize| 2 * k - 1 - op;
            let mut end: Vec<usize> = (0..k).collect();
            // gradient of tensor t: born at the backward of its last consumer
            let mut grad_birth: Vec<Option<usize>> = vec![None; k];
            for op in 0..k {
                for &t in &self.inputs[op] {
                    end[t] = end[t].max(op);
                    grad_birth[t] = Some(grad_birth[t].map_or(bwd(op), |b: usize| b.min(bwd(op))));
                }
                for &t in &self.saved[op] {
                    end[t] = end[t].max(bwd(op));
                }
            }
            let mut reqs: Vec<Interval> = self.params.iter().map(|&w| param(w)).collect();
            for t in 0..k {
                reqs.push(iv(self.sizes[t], t, end[t]));
                if t == 0 {
                    continue; // the input batch needs no gradient
                }
                // the loss (no consumer) gets its seed gradient at its own backward step
                let birth = grad_birth[t].unwrap_or(bwd(t));
                reqs.push(iv(self.sizes[t], birth, bwd(t)));
                if self.wgrad[t] > 0 {
                    reqs.push(iv(self.wgrad[t], bwd(t), bwd(t)));
                }
            }
            reqs
        }
    }

    /// GPT-like decoder blocks: batch `b`, sequence `t`, width `d`, `h` heads, f32.
    fn transformer(layers: usize, b: u64, t: u64, d: u64, h: u64) -> Vec<Interval> {
        let s = b * t * d * 4;
        let att = b * h * t * t * 4;
        let w = d * d * 4;
        let mut tp = Tape::default();
        let mut x = tp.op(b * t * 4, &[], &[], 0); // token ids
        x = tp.op(s, &[x], &[], 50_000 * d * 4); // embedding
        for _ in 0..layers {
            let ln1 = tp.op(s, &[x], &[x], 2 * d * 4);
            let q = tp.op(s, &[ln1], &[ln1], w);
            let k = tp.op(s, &[ln1], &[ln1], w);
            let v = tp.op(s, &[ln1], &[ln1], w);
            let sc = tp.op(att, &[q, k], &[q, k], 0);
            let p = tp.op(att, &[sc], &[], 0);
            tp.saved[p].push(p); // softmax backward reads its output
            let a = tp.op(s, &[p, v], &[p, v], 0);
            let o = tp.op(s, &[a], &[a], w);
            let x1 = tp.op(s, &[x, o], &[], 0);
            let ln2 = tp.op(s, &[x1], &[x1], 2 * d * 4);
            let up = tp.op(4 * s, &[ln2], &[ln2], 4 * w);
            let g = tp.op(4 * s, &[up], &[up], 0);
            let dn = tp.op(s, &[g], &[g], 4 * w);
            x = tp.op(s, &[x1, dn], &[], 0);
        }
        let logits = tp.op(b * t * 50_000 * 4, &[x], &[x], 0);
        tp.op(4, &[logits], &[logits], 0); // loss
        tp.liveness()
    }

    /// A random tape: each op reads one or two of the last few tensors (a random DAG with
    /// skips), has a random output size (odd numbers included) and maybe a weight.
    fn random_tape(seed: u64, ops: usize) -> Vec<Interval> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            s >> 33
        };
        let mut tp = Tape::default();
        tp.op(1 + next() % 100_000, &[], &[], 0);
        for k in 1..ops {
            let a = k - 1 - (next() as usize % k.min(3));
            let mut ins = vec![a];
            if next() % 3 == 0 {
                let b = k - 1 - (next() as usize % k.min(12));
                if b != a {
                    ins.push(b);
                }
            }
            let saved: Vec<usize> = ins.iter().copied().filter(|_| next() % 2 == 0).collect();
            let size = match next() % 4 {
                0 => 1 + next() % 1_000,
                1 => 1 + next() % 100_000,
                _ => 1 + next() % 1_000_000,
            };
            let w = if next() % 2 == 0 { next() % 50_000 } else { 0 };
            tp.op(size, &ins, &saved, w);
        }
        tp.liveness()
    }

    /// Random autodiff tapes (random DAGs with skips, sizes from bytes to megabytes): not a
    /// typical network, so no ratio bound is asserted; the statistics are printed to watch the
    /// heuristic.
    #[test]
    fn random_tapes() {
        let (mut worst, mut sum, mut over) = (1.0f64, 0.0, 0);
        let seeds = 200;
        for seed in 0..seeds {
            let reqs = random_tape(seed, 150);
            let p = place_ok(&reqs, 64);
            let base: u64 = reqs
                .iter()
                .filter(|r| r.persistent)
                .map(|r| r.bytes.div_ceil(64) * 64)
                .sum();
            let r = (p.arena_bytes - base) as f64 / (p.lower_bound - base) as f64;
            worst = worst.max(r);
            sum += r;
            over += usize::from(r > 1.02);
        }
        println!(
            "random tapes: transient ratio mean {:.4} worst {worst:.4}, {over}/{seeds} above 1.02",
            sum / seeds as f64
        );
    }

    #[test]
    fn realistic_transformer() {
        for (layers, b, t, d, h) in [
            (4, 8, 512, 768, 12),
            (12, 4, 1024, 1024, 16),
            (2, 1, 64, 64, 4),
        ] {
            let reqs = transformer(layers, b, t, d, h);
            let name = format!("transformer-{layers}l-b{b}-t{t}-d{d}");
            let r = ratio(&name, &reqs, 256);
            assert!(r <= 1.02, "ratio {r}");
        }
    }

    #[test]
    fn timing_5000() {
        // A deterministic pseudo-random mix of long and short intervals (LCG, no deps).
        let mut s: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            s >> 33
        };
        for n in [5_000usize, 20_000] {
            let reqs: Vec<Interval> = (0..n)
                .map(|_| {
                    let start = (next() % (n as u64 / 2)) as usize;
                    let len = if next() % 4 == 0 {
                        next() % (n as u64 / 4)
                    } else {
                        next() % 20
                    } as usize;
                    Interval {
                        bytes: 1 + next() % 1_000_000,
                        start,
                        end: start + len,
                        persistent: next() % 50 == 0,
                    }
                })
                .collect();
            let t0 = std::time::Instant::now();
            let p = place(&reqs, 64, None).expect("no cap");
            let dt = t0.elapsed();
            println!(
                "timing: n={n} place() took {:.3} s, arena={} lower_bound={} ratio={:.4} \
                 strategy={}",
                dt.as_secs_f64(),
                p.arena_bytes,
                p.lower_bound,
                p.arena_bytes as f64 / p.lower_bound as f64,
                p.strategy
            );
            if n <= 5_000 {
                check_placement(&reqs, &p, 64).expect("valid");
                // the threaded path gives the same answer every time
                assert_eq!(place(&reqs, 64, None), Ok(p));
            }
        }
        // Training-shaped: a deep transformer (every saved activation is live at the turn from
        // forward to backward, so most intervals overlap many others).
        for layers in [110, 440] {
            let reqs = transformer(layers, 1, 128, 256, 4);
            let t0 = std::time::Instant::now();
            let p = place(&reqs, 256, None).expect("no cap");
            println!(
                "timing: transformer n={} place() took {:.3} s, ratio={:.4} strategy={}",
                reqs.len(),
                t0.elapsed().as_secs_f64(),
                p.arena_bytes as f64 / p.lower_bound as f64,
                p.strategy
            );
        }
    }

    // ---------------------------------------------------------------- property tests

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

        #[test]
        fn prop_valid_and_capped(
            reqs in prop::collection::vec(arb_interval(), 0..300),
            align in prop_oneof![Just(1u64), Just(3), Just(8), Just(64), Just(256)],
            cap_frac in prop::option::of(0.5f64..1.5),
        ) {
            let free = place(&reqs, align, None).expect("no cap");
            check_placement(&reqs, &free, align).map_err(TestCaseError::fail)?;
            prop_assert!(free.arena_bytes >= free.lower_bound);
            prop_assert_eq!(free.lower_bound, lower_bound(&reqs, align));
            prop_assert!(free.offsets.iter().all(|o| o % align == 0));
            prop_assert!(
                free.strategy == "trivial"
                    || VARIANTS.iter().flatten().any(|v| *v == free.strategy)
            );
            // persistent intervals: contiguous at the bottom, in input order
            let mut base = 0;
            for (r, &o) in reqs.iter().zip(&free.offsets) {
                if r.persistent && r.bytes > 0 {
                    prop_assert_eq!(o, base);
                    base += r.bytes.div_ceil(align) * align;
                } else if r.bytes > 0 {
                    prop_assert!(o >= base);
                } else {
                    prop_assert_eq!(o, 0);
                }
            }
            if let Some(frac) = cap_frac {
                let cap = (free.arena_bytes as f64 * frac) as u64;
                match place(&reqs, align, Some(cap)) {
                    Ok(p) => {
                        prop_assert!(p.arena_bytes <= cap);
                        prop_assert_eq!(&p, &free);
                    }
                    Err(PlaceError::CapExceeded { needed, cap: c, lower_bound }) => {
                        prop_assert!(free.arena_bytes > cap);
                        prop_assert_eq!(needed, free.arena_bytes);
                        prop_assert_eq!(c, cap);
                        prop_assert_eq!(lower_bound, free.lower_bound);
                    }
                }
            }
        }

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

        /// The checker catches any corruption of a valid placement that makes two live
        /// intervals collide.
        #[test]
        fn prop_checker_catches_collisions(
            reqs in prop::collection::vec(arb_interval(), 2..60),
            a in 0usize..60,
            b in 0usize..60,
        ) {
            let p = place(&reqs, 8, None).expect("no cap");
            let (a, b) = (a % reqs.len(), b % reqs.len());
            let (ra, rb) = (reqs[a], reqs[b]);
            let live_together = ra.persistent || rb.persistent
                || (ra.start <= rb.end && rb.start <= ra.end);
            if a != b && ra.bytes > 0 && rb.bytes > 0 && live_together {
                let mut bad = p.clone();
                bad.offsets[a] = bad.offsets[b];
                prop_assert!(check_placement(&reqs, &bad, 8).is_err());
            }
        }
    }
}
