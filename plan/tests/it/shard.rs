//! Data-parallel sharding: every rank's rows, and the buffers sized for the largest.

use dmc_plan::shard::{max_rows, rows, Layout};

#[test]
fn ranges_partition_the_rows_and_fit_the_largest_shard() {
    for n in 0..40 {
        for world in 1..6 {
            let mut next = 0;
            for r in 0..world {
                let g = rows(n, world, r);
                assert_eq!(g.start, next, "n {n} world {world} rank {r}");
                assert!(g.len() <= max_rows(n, world));
                next = g.end;
            }
            assert_eq!(next, n);
        }
    }
}

#[test]
fn a_layouts_elements_are_its_rows_and_cover_the_tensor() {
    // a [3, 3, 16, 10] convolution weight seen as [144, 10] among 4 ranks
    let l = Layout::of(&[3, 3, 16, 10], 10, 4);
    assert_eq!((l.rows, l.cols), (144, 10));
    assert_eq!(l.shard_elems(), 36 * 10);
    let mut next = 0;
    for r in 0..4 {
        let e = l.elems_of(r);
        assert_eq!(e.start, next);
        assert_eq!(e.len() % 10, 0, "whole rows");
        next = e.end;
    }
    assert_eq!(next, 1440);
    // a bias of 10 among 4: elements 0..2, 2..5, 5..7, 7..10
    let b = Layout::of(&[10], 1, 4);
    let parts: Vec<_> = (0..4).map(|r| b.elems_of(r)).collect();
    assert_eq!(parts, vec![0..2, 2..5, 5..7, 7..10]);
    assert_eq!(b.shard_elems(), 3);
}
