//! Every initialiser against its formula: the sample mean, variance and bounds of a large tensor.

use dmc_plan::plan::Init;
use dmc_runtime::init::{init_values, name_seed};

const N: usize = 200_000;

/// Mean, variance, min, max of `N` values.
fn stats(init: Init) -> (f64, f64, f64, f64) {
    let v: Vec<f64> = init_values(init, name_seed(7, "layer.weight"))
        .take(N)
        .map(f64::from)
        .collect();
    let mean = v.iter().sum::<f64>() / N as f64;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (N - 1) as f64;
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (mean, var, min, max)
}

/// A uniform U(-a, a): mean 0, variance a^2/3, all values inside (-a, a) and reaching close to it.
fn check_uniform(init: Init, a: f64) {
    let (mean, var, min, max) = stats(init);
    let want = a * a / 3.0;
    // standard error of the mean: a / sqrt(3 N); of the variance about 0.9 want / sqrt(N)
    assert!(
        mean.abs() < 5.0 * a / (3.0 * N as f64).sqrt(),
        "{init:?}: mean {mean}"
    );
    assert!(
        (var / want - 1.0).abs() < 0.01,
        "{init:?}: var {var} want {want}"
    );
    assert!(
        min >= -a && max < a,
        "{init:?}: [{min}, {max}] outside ±{a}"
    );
    assert!(
        min < -0.999 * a && max > 0.999 * a,
        "{init:?}: [{min}, {max}] short of ±{a}"
    );
}

/// A normal N(0, s^2): mean 0, variance s^2, fourth moment 3 s^4 (not a uniform of the same
/// variance, whose kurtosis is 1.8), and values beyond 3 s.
fn check_normal(init: Init, s: f64) {
    let v: Vec<f64> = init_values(init, name_seed(7, "layer.weight"))
        .take(N)
        .map(f64::from)
        .collect();
    let (mean, var, min, max) = stats(init);
    let want = s * s;
    assert!(
        mean.abs() < 5.0 * s / (N as f64).sqrt(),
        "{init:?}: mean {mean}"
    );
    assert!(
        (var / want - 1.0).abs() < 0.015,
        "{init:?}: var {var} want {want}"
    );
    let kurt = v.iter().map(|x| x.powi(4)).sum::<f64>() / N as f64 / (want * want);
    assert!((kurt - 3.0).abs() < 0.1, "{init:?}: kurtosis {kurt}");
    assert!(
        min < -3.5 * s && max > 3.5 * s,
        "{init:?}: [{min}, {max}] too narrow"
    );
}

#[test]
fn uniform_initialisers_match_their_bounds_and_variance() {
    let (fi, fo) = (288, 640);
    check_uniform(Init::HeUniform { fan_in: fi }, (6.0 / fi as f64).sqrt());
    check_uniform(
        Init::GlorotUniform {
            fan_in: fi,
            fan_out: fo,
        },
        (6.0 / (fi + fo) as f64).sqrt(),
    );
    check_uniform(Init::LecunUniform { fan_in: fi }, (3.0 / fi as f64).sqrt());
    // PyTorch: kaiming_uniform_(a = sqrt(5)) -> gain sqrt(2 / 6), bound gain * sqrt(3 / fan_in)
    let torch = (2.0f64 / 6.0).sqrt() * (3.0 / fi as f64).sqrt();
    check_uniform(Init::TorchDefault { fan_in: fi }, torch);
    check_uniform(Init::Uniform { limit: 0.05 }, 0.05f32 as f64);
}

#[test]
fn normal_initialisers_match_their_variance() {
    let (fi, fo) = (288, 640);
    check_normal(Init::HeNormal { fan_in: fi }, (2.0 / fi as f64).sqrt());
    check_normal(
        Init::GlorotNormal {
            fan_in: fi,
            fan_out: fo,
        },
        (2.0 / (fi + fo) as f64).sqrt(),
    );
    check_normal(Init::LecunNormal { fan_in: fi }, (1.0 / fi as f64).sqrt());
    check_normal(Init::Normal { std: 0.02 }, 0.02f32 as f64);
}

#[test]
fn constant_initialisers() {
    assert!(init_values(Init::Zeros, 1).take(100).all(|x| x == 0.0));
    assert!(init_values(Init::Ones, 1).take(100).all(|x| x == 1.0));
}

/// The default initialisers' streams are those of the weights saved before the others existed.
#[test]
fn default_streams_are_unchanged() {
    use rand::{Rng, SeedableRng};
    let key = name_seed(3, "dense_1.weight");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(key);
    let b = (6.0f64 / 100.0).sqrt() as f32;
    let want: Vec<f32> = (0..64).map(|_| rng.random_range(-b..b)).collect();
    let got: Vec<f32> = init_values(Init::HeUniform { fan_in: 100 }, key)
        .take(64)
        .collect();
    assert_eq!(got, want);
}
