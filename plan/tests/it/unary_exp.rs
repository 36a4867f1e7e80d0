//! The library-call-free `exp` that GELU's element loops use (so they vectorize) against the
//! standard library's, across the whole range GELU feeds it and at the edges of the clamp.

use dmc_plan::unary::exp;

/// Distance in units in the last place between two positive finite f64.
fn ulps(a: f64, b: f64) -> u64 {
    (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs()
}

#[test]
fn exp_is_within_two_ulp_of_the_standard_library() {
    let mut worst = 0;
    let n = 200_000;
    for i in 0..=n {
        let x = -708.0 + 1417.0 * i as f64 / n as f64;
        let (got, want) = (exp(x), x.exp());
        assert!(got.is_finite() && got > 0.0, "exp({x}) = {got}");
        worst = worst.max(ulps(got, want));
    }
    // small arguments, where the reduction is exact
    for i in -1000..=1000 {
        let x = i as f64 * 1e-3;
        worst = worst.max(ulps(exp(x), x.exp()));
    }
    assert!(worst <= 2, "worst error {worst} ulp");
    assert_eq!(exp(0.0), 1.0);
}

#[test]
fn exp_clamps_outside_the_normal_range() {
    // below: e^-708 (a normal number, ~3e-308) stands for 0; above: e^709 stands for infinity's
    // neighbourhood (GELU never goes there: its arguments are -z^2 - ... <= 0)
    assert_eq!(exp(-1e6), exp(-708.0));
    assert!(exp(-1e6) < 1e-307);
    assert_eq!(exp(1e6), exp(709.0));
    assert!(exp(f64::NAN).is_nan());
}
