//! The collectives of `dmc_runtime::comm` on an in-process group of ranks (`LocalComm`, one
//! thread per rank): sums against an f64 reference, determinism, uneven shards, the small
//! all-reduce's bit-identical rank-order sum, the gather to rank 0, and the single-process case.

use crate::common;

use common::*;
use dmc_plan::shard::{max_rows, rows};
use dmc_runtime::comm::local::LocalComm;
use dmc_runtime::comm::{
    all_gather_rows, all_reduce_sum, all_reduce_sum_f64, barrier, gather_rows_to_root,
    reduce_scatter_rows, Collective, Solo,
};
use dmc_runtime::RuntimeError;

/// Runs `f` on every rank of a `world`-rank group, one thread each; the results in rank order.
fn on_ranks<T: Send>(world: usize, f: impl Fn(&dyn Collective) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = LocalComm::group(world)
            .into_iter()
            .map(|c| {
                let f = &f;
                s.spawn(move || f(&c))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

/// Rank `rank`'s contribution to a case (seeded by the case and the rank).
fn contribution(seed: u64, rank: usize, n: usize) -> Vec<f32> {
    randv(&mut rng(seed * 64 + rank as u64), n)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// reduce_scatter_rows then all_gather_rows; every rank's final buffer.
fn sum_rows(world: usize, seed: u64, rows_total: usize, row_len: usize) -> Vec<Vec<f32>> {
    on_ranks(world, |c| {
        let mut buf = contribution(seed, c.rank(), rows_total * row_len);
        let mut tmp = vec![0.0; max_rows(rows_total, world) * row_len];
        reduce_scatter_rows(c, &mut buf, row_len, rows_total, &mut tmp).expect("reduce_scatter");
        all_gather_rows(c, &mut buf, row_len, rows_total).expect("all_gather");
        buf
    })
}

const CASES: [(usize, usize); 9] = [
    (10, 3),   // even-ish
    (7, 2),    // 7 rows among 3 ranks: 2, 2, 3
    (1, 5),    // fewer rows than ranks: some ranks get none
    (2, 4),    // likewise
    (0, 3),    // no rows
    (5, 0),    // empty rows
    (64, 257), // bigger
    (3, 1),
    (1000, 1),
];

#[test]
fn reduce_scatter_then_all_gather_gives_every_rank_the_sum() {
    for world in 1..=4 {
        for (i, &(rows_total, row_len)) in CASES.iter().enumerate() {
            let seed = i as u64;
            let what = format!("world {world}, {rows_total} rows of {row_len}");
            let n = rows_total * row_len;
            let parts: Vec<_> = (0..world).map(|r| contribution(seed, r, n)).collect();
            let want: Vec<f64> = (0..n)
                .map(|j| parts.iter().map(|p| p[j] as f64).sum())
                .collect();
            let scale: Vec<f64> = (0..n)
                .map(|j| parts.iter().map(|p| p[j].abs() as f64).sum())
                .collect();
            let got = sum_rows(world, seed, rows_total, row_len);
            for (r, g) in got.iter().enumerate() {
                assert_eq!(g.len(), n, "{what}: rank {r} length");
                for j in 0..n {
                    let err = (g[j] as f64 - want[j]).abs();
                    assert!(
                        err <= 1e-6 * scale[j].max(1e-30),
                        "{what}: rank {r} element {j}: got {}, want {}",
                        g[j],
                        want[j]
                    );
                }
                assert_eq!(
                    bits(g),
                    bits(&got[0]),
                    "{what}: rank {r} differs from rank 0"
                );
            }
            let again = sum_rows(world, seed, rows_total, row_len);
            assert_eq!(
                got.iter().map(|g| bits(g)).collect::<Vec<_>>(),
                again.iter().map(|g| bits(g)).collect::<Vec<_>>(),
                "{what}: a second run differs"
            );
        }
    }
}

#[test]
fn reduce_scatter_leaves_each_rank_its_rows_summed() {
    // 7 rows among 3 ranks (2, 2, 3 rows), small integers: the sums are exact.
    let (world, rows_total, row_len) = (3, 7, 2);
    let got = on_ranks(world, |c| {
        let r = c.rank();
        let mut buf: Vec<f32> = (0..rows_total * row_len)
            .map(|j| (j * 10 + r) as f32)
            .collect();
        let mut tmp = vec![f32::NAN; max_rows(rows_total, world) * row_len];
        reduce_scatter_rows(c, &mut buf, row_len, rows_total, &mut tmp).expect("reduce_scatter");
        buf
    });
    for (r, g) in got.iter().enumerate() {
        let mine = rows(rows_total, world, r);
        let e = mine.start * row_len..mine.end * row_len;
        for (j, &x) in g.iter().enumerate().take(e.end).skip(e.start) {
            assert_eq!(x, (3 * j * 10 + 3) as f32, "rank {r} element {j}");
        }
    }
}

/// The out-of-place reduction: each rank's rows summed into its own buffer, the source untouched.
#[test]
fn reduce_into_sums_each_ranks_rows_and_leaves_the_source() {
    let (world, rows_total, row_len) = (3, 7, 2);
    let got = on_ranks(world, |c| {
        let r = c.rank();
        let src: Vec<f32> = (0..rows_total * row_len)
            .map(|j| (j * 10 + r) as f32)
            .collect();
        let n = rows(rows_total, world, r).len() * row_len;
        let (mut acc, mut tmp) = (vec![f32::NAN; n], vec![f32::NAN; n]);
        dmc_runtime::comm::reduce_rows_into(c, &src, (row_len, rows_total), &mut acc, &mut tmp)
            .expect("reduce_into");
        let untouched = src
            .iter()
            .enumerate()
            .all(|(j, &x)| x == (j * 10 + r) as f32);
        (acc, untouched)
    });
    for (r, (acc, untouched)) in got.iter().enumerate() {
        assert!(untouched, "rank {r}'s source was written");
        let mine = rows(rows_total, world, r);
        for (i, j) in (mine.start * row_len..mine.end * row_len).enumerate() {
            assert_eq!(acc[i], (3 * j * 10 + 3) as f32, "rank {r} element {j}");
        }
    }
}

#[test]
fn all_reduce_is_the_rank_order_sum_on_every_rank() {
    for world in 1..=4 {
        for n in [0, 1, 3, 100] {
            let parts: Vec<_> = (0..world)
                .map(|r| contribution(100 + n as u64, r, n))
                .collect();
            let mut want = parts[0].clone();
            for p in &parts[1..] {
                for (w, x) in want.iter_mut().zip(p) {
                    *w += *x;
                }
            }
            let got = on_ranks(world, |c| {
                let mut buf = parts[c.rank()].clone();
                all_reduce_sum(c, &mut buf).expect("all_reduce_sum");
                buf
            });
            for (r, g) in got.iter().enumerate() {
                assert_eq!(bits(g), bits(&want), "world {world}, n {n}: rank {r}");
            }
            let got64 = on_ranks(world, |c| {
                let mut buf: Vec<f64> = parts[c.rank()].iter().map(|&x| x as f64 / 3.0).collect();
                all_reduce_sum_f64(c, &mut buf).expect("all_reduce_sum_f64");
                buf
            });
            let want64: Vec<f64> = (0..n)
                .map(|j| (0..world).fold(0.0, |s, r| s + parts[r][j] as f64 / 3.0))
                .collect();
            for (r, g) in got64.iter().enumerate() {
                let gb: Vec<u64> = g.iter().map(|x| x.to_bits()).collect();
                let wb: Vec<u64> = want64.iter().map(|x| x.to_bits()).collect();
                assert_eq!(gb, wb, "f64, world {world}, n {n}: rank {r}");
            }
        }
    }
}

#[test]
fn gather_to_root_gives_rank_0_every_rank_s_rows() {
    for world in 1..=4 {
        for (i, &(rows_total, row_len)) in CASES.iter().enumerate() {
            let n = rows_total * row_len;
            let full = contribution(200 + i as u64, 0, n);
            let got = on_ranks(world, |c| {
                // only this rank's rows are valid; the others are NaN
                let mine = rows(rows_total, world, c.rank());
                let mut buf = vec![f32::NAN; n];
                let e = mine.start * row_len..mine.end * row_len;
                buf[e.clone()].copy_from_slice(&full[e]);
                gather_rows_to_root(c, &mut buf, row_len, rows_total).expect("gather");
                buf
            });
            assert_eq!(
                bits(&got[0]),
                bits(&full),
                "world {world}, {rows_total} rows of {row_len}"
            );
        }
    }
}

#[test]
fn barrier_and_single_process() {
    for world in 1..=4 {
        on_ranks(world, |c| barrier(c).expect("barrier"));
    }
    let solo = Solo;
    assert_eq!((solo.rank(), solo.world()), (0, 1));
    let mut buf = vec![1.0, 2.0, 3.0];
    reduce_scatter_rows(&solo, &mut buf, 1, 3, &mut []).expect("solo reduce_scatter");
    all_gather_rows(&solo, &mut buf, 1, 3).expect("solo all_gather");
    all_reduce_sum(&solo, &mut buf).expect("solo all_reduce");
    gather_rows_to_root(&solo, &mut buf, 1, 3).expect("solo gather");
    barrier(&solo).expect("solo barrier");
    assert_eq!(buf, [1.0, 2.0, 3.0]);
    let mut out = [0u8; 2];
    solo.sendrecv(&[7, 8], 0, &mut out, 0)
        .expect("solo sendrecv copies");
    assert_eq!(out, [7, 8]);
    assert!(matches!(solo.send(&[1], 1), Err(RuntimeError::Comm(_))));
}

#[test]
fn misuse_is_an_error_not_a_hang() {
    // tmp too small
    let errs = on_ranks(2, |c| {
        let mut buf = vec![0.0f32; 8];
        reduce_scatter_rows(c, &mut buf, 2, 4, &mut [0.0; 3])
            .err()
            .map(|e| e.to_string())
    });
    for e in errs {
        let e = e.expect("a too small tmp is an error");
        assert!(e.contains("needs 4"), "{e}");
    }
    // mismatched sizes: rank 1 expects more bytes than rank 0 sends
    let errs = on_ranks(2, |c| {
        let mut buf = vec![0.0f32; 1 + c.rank()];
        all_reduce_sum(c, &mut buf).err().map(|e| e.to_string())
    });
    assert!(
        errs.iter().flatten().any(|e| e.contains("do not match")),
        "{errs:?}"
    );
}
