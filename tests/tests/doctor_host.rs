//! `svc doctor --microvm` against the real microvm images: the rootfs holds the guest agent
//! (read from the ext4 image itself), the kernel image is readable; a file that is not an ext4
//! image, or one without the agent, fails the required probe with a fix.

use std::process::Command;

use svc_tests::world::{microvm_images, offline_microvm_doctor, workspace_bin};

fn doctor(env: &[(&str, &std::path::Path)]) -> serde_json::Value {
    let dir = svc_tests::fresh_dir("docws");
    let mut c = offline_microvm_doctor(&dir);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("svc doctor");
    let _ = std::fs::remove_dir_all(&dir);
    serde_json::from_slice(&out.stdout).expect("the report")
}

fn probe<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("{name} in {report:#}"))
}

#[test]
fn the_microvm_probes_read_the_real_images() {
    let images = microvm_images();
    let rootfs = images.join("rootfs.ext4");
    let report = doctor(&[
        ("SVC_MICROVM_KERNEL", &images.join("vmlinuz")),
        ("SVC_MICROVM_ROOTFS", &rootfs),
    ]);
    for name in [
        "host:svc-microvm-kernel",
        "host:svc-microvm-rootfs",
        "host:microvm-agent",
        "host:microvm-user",
    ] {
        assert_eq!(probe(&report, name)["status"], "passed", "{report:#}");
    }
    assert_eq!(
        probe(&report, "host:microvm-agent")["output"],
        format!(
            "{} holds /usr/local/bin/svc-microvm-agent",
            rootfs.display()
        )
    );

    // The kernel image is no ext4 image: refused, with the fix.
    let kernel = images.join("vmlinuz");
    let report = doctor(&[("SVC_MICROVM_ROOTFS", &kernel)]);
    let agent = probe(&report, "host:microvm-agent");
    assert_eq!(agent["status"], "failed");
    assert_eq!(agent["required"], true);
    let why = agent["reason"].as_str().expect("reason");
    assert!(
        why.starts_with(&format!(
            "{} is not an ext4 image debugfs can read",
            kernel.display()
        )) && why.contains("— fix: build the images with `svcd images build`"),
        "{why}"
    );
    assert_eq!(
        probe(&report, "host:svc-microvm-kernel")["reason"],
        "SVC_MICROVM_KERNEL is not set — fix: set it to the microvm image (svcd images build makes them)"
    );

    // An ext4 image without the agent.
    let empty = std::env::temp_dir().join(format!("{}.ext4", svc_tests::unique("noagent")));
    let made = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&empty)
        .arg("4M")
        .status()
        .expect("mkfs.ext4");
    assert!(made.success());
    let report = doctor(&[("SVC_MICROVM_ROOTFS", &empty)]);
    assert_eq!(
        probe(&report, "host:microvm-agent")["reason"],
        format!(
            "{} has no /usr/local/bin/svc-microvm-agent — fix: build the images with `svcd images build` (the rootfs gets the agent), or point SVC_MICROVM_ROOTFS at one",
            empty.display()
        )
    );
    let _ = std::fs::remove_file(&empty);
}

/// `svc doctor`'s `host:oci-runtime` with runc: a runc older than the fixed releases is a
/// warning (not required) naming the three advisories and the fixed versions; a fixed release
/// passes. The runc on PATH is a script reporting each version, and the crun first on PATH one
/// too old to be the default (so the default falls back to runc).
#[test]
fn the_doctor_warns_about_a_runc_older_than_the_fixes() {
    let dir = svc_tests::fresh_dir("docrunc");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let old_crun = bin.join("crun");
    std::fs::write(&old_crun, "#!/bin/sh\necho 'crun version 1.8.1'\n").expect("crun");
    std::fs::set_permissions(
        &old_crun,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    for (version, commit, status) in [
        ("1.1.5+ds1", "1.1.5+ds1-1+deb12u1", "failed"),
        ("1.3.3", "v1.3.3-0-gd842d771", "passed"),
    ] {
        let script = bin.join("runc");
        std::fs::write(
            &script,
            format!("#!/bin/sh\necho 'runc version {version}'\necho 'commit: {commit}'\n"),
        )
        .expect("runc");
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        let out = Command::new(workspace_bin("svc"))
            .args(["--socket", "/nonexistent/svcd.sock", "doctor", "--json"])
            .arg(&dir)
            .env("PATH", &path)
            .output()
            .expect("svc doctor");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the report");
        let runc = probe(&report, "host:oci-runtime");
        assert_eq!(runc["status"], status, "{version}: {runc}");
        assert_eq!(runc["required"], false, "{runc}");
        if status == "failed" {
            let why = runc["reason"].as_str().expect("reason");
            for part in [
                "runc 1.1.5+ds1 (1.1.5+ds1-1+deb12u1) predates the fixes for",
                "CVE-2025-31133, CVE-2025-52565 and CVE-2025-52881",
                "runc 1.2.8 and 1.3.3",
                "— fix: install runc 1.2.8, 1.3.3 or later",
            ] {
                assert!(why.contains(part), "{part} in {why}");
            }
        } else {
            assert_eq!(
                runc["output"],
                "runc 1.3.3 (v1.3.3-0-gd842d771) carries the fixes for CVE-2025-31133, \
                 CVE-2025-52565 and CVE-2025-52881"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
