//! Parameter initialisation, the same on every backend: each parameter's values are an endless
//! stream from an RNG keyed by `(seed, parameter name)` ([`name_seed`]), so they do not depend on
//! the parameter order. The CPU backend writes them into its arena; the CUDA and emulated backends
//! generate them on the host and copy them
//! ([`HostArena::init_params`](crate::HostArena::init_params)).

use dmc_plan::plan::Init;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::hash::mix64;

/// The initial values of a parameter (an endless stream; take `numel`): `key` is
/// [`name_seed`]`(seed, name)`.
pub fn init_values(init: Init, key: u64) -> impl Iterator<Item = f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(key);
    let (bound, constant) = match init {
        Init::HeUniform { fan_in } => ((6.0 / fan_in.max(1) as f64).sqrt(), 0.0),
        Init::GlorotUniform { fan_in, fan_out } => {
            ((6.0 / (fan_in + fan_out).max(1) as f64).sqrt(), 0.0)
        }
        Init::Zeros => (0.0, 0.0),
        Init::Ones => (0.0, 1.0),
    };
    let bound = bound as f32;
    std::iter::repeat_with(move || {
        if bound > 0.0 {
            rng.random_range(-bound..bound)
        } else {
            constant
        }
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
