//! The GPUs the performance model knows: each one's documented peak numbers (vendor data sheets and
//! the CUDA programming guide's per-architecture limits), plus two latencies that no data sheet
//! gives, calibrated on the H200 (see [`crate::perf`]).

use serde::Serialize;

/// One GPU's numbers, as the performance model uses them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Gpu {
    /// The canonical name (`--gpu` takes it or an alias, case-insensitive).
    pub name: &'static str,
    /// Other names `--gpu` accepts.
    pub aliases: &'static [&'static str],
    /// The architecture NVRTC compiles for (`sm_90`).
    pub arch: &'static str,
    pub sms: u32,
    /// Boost clock, GHz.
    pub clock_ghz: f64,
    /// FP32 lanes per SM (an FFMA warp instruction takes `32 / lanes * 4` scheduler cycles).
    pub fp32_lanes: u32,
    /// Peak DRAM bandwidth, bytes/s.
    pub dram_bw: f64,
    /// L2 size, bytes.
    pub l2_bytes: u64,
    /// Peak dense TF32 tensor-core FLOP/s (0: none).
    pub tf32_flops: f64,
    pub max_threads_per_sm: u32,
    pub max_blocks_per_sm: u32,
    pub regs_per_sm: u32,
    /// Shared memory one SM can give its resident blocks, bytes.
    pub smem_per_sm: u32,
    /// Device memory, bytes.
    pub memory_bytes: u64,
    /// Its host link (streaming's copies cross it: [`dmc_plan::link`]).
    pub link: dmc_plan::link::Link,
}

impl Gpu {
    /// Peak FP32 FLOP/s (an FMA is two).
    pub fn fp32_flops(&self) -> f64 {
        f64::from(self.sms) * f64::from(self.fp32_lanes) * 2.0 * self.clock_ghz * 1e9
    }

    /// Seconds per cycle.
    pub fn cycle_s(&self) -> f64 {
        1e-9 / self.clock_ghz
    }

    /// The compute capability as a number (`sm_90` -> 90).
    pub fn sm(&self) -> u32 {
        sm_of(self.arch)
    }
}

/// The compute capability of an NVRTC architecture name as a number (`sm_90` -> 90; 0 if
/// unreadable).
pub fn sm_of(arch: &str) -> u32 {
    arch.strip_prefix("sm_")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

const H100_SXM: Gpu = Gpu {
    name: "H100",
    aliases: &["h100-sxm", "h100_sxm"],
    arch: "sm_90",
    sms: 132,
    clock_ghz: 1.98,
    fp32_lanes: 128,
    dram_bw: 3.35e12,
    l2_bytes: 50 << 20,
    tf32_flops: 494.7e12,
    max_threads_per_sm: 2048,
    max_blocks_per_sm: 32,
    regs_per_sm: 65536,
    smem_per_sm: 228 << 10,
    memory_bytes: 80 << 30,
    link: dmc_plan::link::LINKS[2],
};

/// The GPUs `--gpu` names, the first the default.
pub const GPUS: &[Gpu] = &[
    Gpu {
        name: "H200",
        aliases: &["h200-sxm", "h200_sxm"],
        dram_bw: 4.8e12,
        memory_bytes: 141 << 30,
        ..H100_SXM
    },
    H100_SXM,
    Gpu {
        name: "A100",
        aliases: &["a100-sxm", "a100-80gb", "a100_80gb"],
        arch: "sm_80",
        sms: 108,
        clock_ghz: 1.41,
        fp32_lanes: 64,
        dram_bw: 2.039e12,
        l2_bytes: 40 << 20,
        tf32_flops: 156e12,
        max_threads_per_sm: 2048,
        max_blocks_per_sm: 32,
        regs_per_sm: 65536,
        smem_per_sm: 164 << 10,
        memory_bytes: 80 << 30,
        link: dmc_plan::link::LINKS[1],
    },
    Gpu {
        name: "RTX4090",
        aliases: &["rtx-4090", "rtx_4090", "4090"],
        arch: "sm_89",
        sms: 128,
        clock_ghz: 2.52,
        fp32_lanes: 128,
        dram_bw: 1.008e12,
        l2_bytes: 72 << 20,
        tf32_flops: 82.6e12,
        max_threads_per_sm: 1536,
        max_blocks_per_sm: 24,
        regs_per_sm: 65536,
        smem_per_sm: 100 << 10,
        memory_bytes: 24 << 30,
        link: dmc_plan::link::LINKS[1],
    },
    // The question's GPU (a 2 GB Maxwell card).
    Gpu {
        name: "GTX960",
        aliases: &["gtx-960", "gtx_960", "960"],
        arch: "sm_52",
        sms: 8,
        clock_ghz: 1.178,
        fp32_lanes: 128,
        dram_bw: 112e9,
        l2_bytes: 1 << 20,
        tf32_flops: 0.0,
        max_threads_per_sm: 2048,
        max_blocks_per_sm: 32,
        regs_per_sm: 65536,
        smem_per_sm: 96 << 10,
        memory_bytes: 2 << 30,
        link: dmc_plan::link::LINKS[0],
    },
];

/// The GPU `name` names (its name or an alias, case-insensitive).
pub fn gpu(name: &str) -> Option<&'static Gpu> {
    let n = name.trim().to_ascii_lowercase();
    GPUS.iter()
        .find(|g| g.name.to_ascii_lowercase() == n || g.aliases.contains(&n.as_str()))
}

/// The GPU whose device name (as the driver reports it, e.g. `NVIDIA H200`) names one of the
/// table, for the model of a run on that device.
pub fn gpu_of_device(device_name: &str) -> Option<&'static Gpu> {
    let d = device_name
        .to_ascii_lowercase()
        .replace([' ', '-', '_'], "");
    GPUS.iter()
        .find(|g| d.contains(&g.name.to_ascii_lowercase()))
}

/// The names `--gpu` accepts, for an error message.
pub fn gpu_names() -> String {
    GPUS.iter().map(|g| g.name).collect::<Vec<_>>().join(", ")
}
