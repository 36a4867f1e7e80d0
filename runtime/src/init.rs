//! Parameter initialisation, the same on every backend: each parameter's values are an endless
//! stream from an RNG keyed by `(seed, parameter name)` ([`name_seed`]), so they do not depend on
//! the parameter order. The CPU backend writes them into its arena; the CUDA and emulated backends
//! generate them on the host and copy them
//! ([`HostArena::init_params`](crate::HostArena::init_params)).

use dmc_plan::plan::Init;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::hash::mix64;

/// How one initialiser draws each value.
#[derive(Clone, Copy)]
enum Dist {
    /// U(-bound, bound) (a constant 0 when `bound` is not positive).
    Uniform(f32),
    /// N(0, std^2) (a constant 0 when `std` is not positive).
    Normal(f64),
    Const(f32),
}

fn dist(init: Init) -> Dist {
    let fan = |n: usize| n.max(1) as f64;
    match init {
        Init::HeUniform { fan_in } => Dist::Uniform((6.0 / fan(fan_in)).sqrt() as f32),
        Init::GlorotUniform { fan_in, fan_out } => {
            Dist::Uniform((6.0 / fan(fan_in + fan_out)).sqrt() as f32)
        }
        Init::LecunUniform { fan_in } => Dist::Uniform((3.0 / fan(fan_in)).sqrt() as f32),
        Init::TorchDefault { fan_in } => Dist::Uniform((1.0 / fan(fan_in)).sqrt() as f32),
        Init::Uniform { limit } => Dist::Uniform(limit),
        Init::HeNormal { fan_in } => Dist::Normal((2.0 / fan(fan_in)).sqrt()),
        Init::GlorotNormal { fan_in, fan_out } => {
            Dist::Normal((2.0 / fan(fan_in + fan_out)).sqrt())
        }
        Init::LecunNormal { fan_in } => Dist::Normal((1.0 / fan(fan_in)).sqrt()),
        Init::Normal { std } => Dist::Normal(std as f64),
        Init::Zeros => Dist::Const(0.0),
        Init::Ones => Dist::Const(1.0),
    }
}

/// The initial values of a parameter (an endless stream; take `numel`): `key` is
/// [`name_seed`]`(seed, name)`. Uniform values are one `random_range(-b..b)` each (the stream of
/// the He / Glorot defaults, unchanged since they were the only ones); normal values one
/// Box-Muller transform of two uniform draws each.
pub fn init_values(init: Init, key: u64) -> impl Iterator<Item = f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(key);
    let d = dist(init);
    std::iter::repeat_with(move || match d {
        Dist::Uniform(bound) if bound > 0.0 => rng.random_range(-bound..bound),
        Dist::Normal(std) if std > 0.0 => {
            // u1 in (0, 1]: ln(u1) is finite
            let u1 = 1.0 - rng.random::<f64>();
            let u2 = rng.random::<f64>();
            (std * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        }
        Dist::Uniform(_) | Dist::Normal(_) => 0.0,
        Dist::Const(c) => c,
    })
}

/// The per-parameter RNG key: `(seed, name)`, so values don't depend on the parameter order.
pub fn name_seed(seed: u64, name: &str) -> u64 {
    // FNV-1a of the name, mixed with the seed.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    mix64(mix64(seed) ^ h)
}
