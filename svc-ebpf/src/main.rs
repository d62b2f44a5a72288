//! The tc fence attached to the host end of every guest link.
//!
//! Built for `bpfel-unknown-none` by `svc-control/build.rs`. On the host the crate is only
//! checked (clippy), never run, so it is an ordinary `std` binary there.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    macros::{classifier, map},
    maps::PerCpuArray,
    programs::TcContext,
};
use svc_ebpf::parse::{self, Frame, OutOfBounds};
use svc_ebpf_common::{Counter, reason};

/// Packets and bytes per verdict reason (see `svc_ebpf_common::map::COUNTERS`).
#[map(name = "SVC_COUNTERS")]
static SVC_COUNTERS: PerCpuArray<Counter> = PerCpuArray::pinned(reason::COUNT, 0);

/// Guest → host. Thin: classify, count, turn the reason into a tc verdict.
#[classifier]
pub fn svc_tap_ingress(ctx: TcContext) -> i32 {
    let frame = TcFrame(&ctx);
    let code = match parse::classify_ingress(&frame) {
        Ok(code) | Err(code) => code,
    };
    count(code, frame.len());
    if reason::is_drop(code) {
        TC_ACT_SHOT
    } else {
        TC_ACT_OK
    }
}

fn count(code: u32, len: usize) {
    if let Some(counter) = SVC_COUNTERS.get_ptr_mut(code) {
        // SAFETY: the pointer comes from a successful map lookup of this CPU's slot, which the
        // kernel keeps valid for the whole program run; per-CPU slots are never shared, so no
        // other writer races this one.
        unsafe {
            (*counter).packets += 1;
            (*counter).bytes += len as u64;
        }
    }
}

struct TcFrame<'a>(&'a TcContext);

impl Frame for TcFrame<'_> {
    fn len(&self) -> usize {
        self.0.len() as usize
    }

    fn load_be16(&self, offset: usize) -> Result<u16, OutOfBounds> {
        self.0
            .load::<u16>(offset)
            .map(u16::from_be)
            .map_err(|_| OutOfBounds)
    }
}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // No panic path survives into the object (the verifier would reject the loop); this only
    // satisfies `no_std`.
    #[expect(
        clippy::empty_loop,
        reason = "no_std panic handler that is never reached"
    )]
    loop {}
}

/// Host builds only exist for linting.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
