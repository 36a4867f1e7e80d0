//! [`CountingOver`] (the counting allocator over another allocator, as the `dmc` binary installs
//! it over mimalloc) counts like [`dmc_runtime::alloc::CountingAlloc`]: installed as this test
//! binary's global allocator, over `System`.

use std::alloc::System;

use dmc_runtime::alloc::{self, CountingOver};

#[global_allocator]
static GLOBAL: CountingOver<System> = CountingOver(System);

#[test]
fn counts_current_and_peak_over_another_allocator() {
    // tests in this binary run one at a time (a single test), so the counters are ours
    let before = alloc::current();
    let v = vec![1u8; 10 << 20];
    assert!(alloc::current() >= before + (10 << 20));
    assert!(alloc::peak() >= before + (10 << 20));
    drop(v);
    assert!(alloc::current() < before + (1 << 20));
    alloc::reset_peak();
    assert!(alloc::peak() < before + (1 << 20));
    let mut v = Vec::<u8>::with_capacity(1 << 20);
    v.resize(8 << 20, 0); // realloc grows
    assert!(alloc::peak() >= before + (8 << 20));
    v.truncate(1);
    v.shrink_to_fit(); // realloc shrinks
    assert!(alloc::current() < before + (1 << 20));
    drop(v);
}
