//! Running the fence's classifiers on crafted frames (`BPF_PROG_TEST_RUN`): verdicts for
//! tests, the kernel's time per run for benchmarks.

use aya::programs::{TestRun as _, TestRunOptions};
use svc_ebpf_common::program;

use super::{
    error::DataplaneError,
    fence::Fence,
    tcx::{Direction, classifier},
};

/// Result of running the ingress classifier once on a crafted frame (`BPF_PROG_TEST_RUN`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestRunOutcome {
    /// The tc action the program returned (`TC_ACT_OK` = 0, `TC_ACT_SHOT` = 2).
    pub action: u32,
}

impl TestRunOutcome {
    /// `TC_ACT_SHOT`: the frame was dropped.
    pub const fn dropped(self) -> bool {
        self.action == 2
    }
    /// `TC_ACT_OK`: the frame passed.
    pub const fn passed(self) -> bool {
        self.action == 0
    }
}

impl Fence {
    /// Run the ingress classifier once on `frame` with `BPF_PROG_TEST_RUN`. Counters move as
    /// they would for a real packet.
    pub fn test_run(&mut self, frame: &[u8]) -> Result<TestRunOutcome, DataplaneError> {
        self.test_run_dir(Direction::Ingress, frame)
    }

    /// Run one direction's classifier `repeat` times on `frame`; the kernel's average time per
    /// run (the program alone, no stack around it). For benchmarks.
    pub fn test_run_timed(
        &mut self,
        direction: Direction,
        frame: &[u8],
        repeat: u32,
    ) -> Result<std::time::Duration, DataplaneError> {
        self.test_run_program_timed(direction.program(), frame, repeat)
    }

    /// [`Self::test_run_timed`] of the empty calibration program: the floor any tc program
    /// pays on this machine.
    pub fn test_run_calibration(
        &mut self,
        frame: &[u8],
        repeat: u32,
    ) -> Result<std::time::Duration, DataplaneError> {
        self.test_run_program_timed(program::CALIBRATE, frame, repeat)
    }

    fn test_run_program_timed(
        &mut self,
        name: &'static str,
        frame: &[u8],
        repeat: u32,
    ) -> Result<std::time::Duration, DataplaneError> {
        let prog = classifier(&mut self.ebpf, name)?;
        let mut out = vec![0u8; frame.len().max(64) + 256];
        let result = prog
            .test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                repeat,
                ..TestRunOptions::new()
            })
            .map_err(|source| DataplaneError::Program {
                operation: "test-running",
                program: name,
                source: Box::new(source),
            })?;
        Ok(result.duration)
    }

    /// Run one direction's classifier once on `frame`. The kernel runs test frames on the
    /// loopback device, so the sandbox record they see is the one for ifindex 1.
    pub fn test_run_dir(
        &mut self,
        direction: Direction,
        frame: &[u8],
    ) -> Result<TestRunOutcome, DataplaneError> {
        let name = direction.program();
        let prog = classifier(&mut self.ebpf, name)?;
        let mut out = vec![0u8; frame.len().max(64) + 256];
        let result = prog
            .test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                ..TestRunOptions::new()
            })
            .map_err(|source| DataplaneError::Program {
                operation: "test-running",
                program: name,
                source: Box::new(source),
            })?;
        // The mark the program set is not returned by the kernel; callers read counters.
        Ok(TestRunOutcome {
            action: result.return_value,
        })
    }
}
