//! splitmix64's finaliser, the one 64-bit mix behind both counter-based streams of the runtime:
//! the per-parameter initialisation keys ([`crate::init::name_seed`]) and the dropout mask
//! ([`crate::cpu::elementwise::DropoutRng`]).

/// splitmix64's finaliser: a bijective 64-bit mix.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
