//! `svcd images build` and `svcd images status`: the sandboxes' images on this host, where
//! svcd.toml says svcd reads them (or under `--out DIR`), from the guest binaries the package
//! installs (or `--guest-bins DIR`).

use std::{path::PathBuf, process::ExitCode};

use clap::{Args, Subcommand};
use svc_control::{
    config::host::HostConfig,
    images::{self, Layout, Which},
};

/// `svcd images …`.
#[derive(Debug, Subcommand)]
pub enum ImagesCommand {
    /// Build the sandboxes' images from Debian packages: the base tree (mmdebstrap with this
    /// host's apt sources, plus the guest binaries), then from it the microvm kernel, initramfs
    /// and ext4 root file system. Each step is skipped when its image is current (its stamp
    /// matches), so running it again changes nothing. Needs root and mmdebstrap (the microvm
    /// images also e2fsprogs). Exits 0 when built or current, 1 when a step failed, 78 when
    /// svcd.toml is invalid.
    Build(BuildArgs),
    /// Say what images are there, their stamps, and whether each is current (a build would
    /// leave it as it is). Exits 0 whatever it finds.
    #[command(alias = "list")]
    Status(StatusArgs),
}

/// Where the images are and what they are made from.
#[derive(Debug, Args)]
pub struct Where {
    /// Put the images under DIR (DIR/base, DIR/microvm/{vmlinuz,initrd.img,rootfs.ext4})
    /// instead of where svcd.toml says svcd reads them (container.image; microvm.kernel,
    /// microvm.initrd and microvm.rootfs, by default in microvm/ beside the base image).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// The directory holding the statically linked guest binaries (svc-microvm-agent,
    /// svc-git-ssh, svc-supervise, svc-init).
    #[arg(long, value_name = "DIR", default_value = images::PACKAGED_GUEST_BINS)]
    guest_bins: PathBuf,
    /// Print JSON on stdout (progress lines go to stderr).
    #[arg(long)]
    json: bool,
}

/// `svcd images build`'s arguments.
#[derive(Debug, Args)]
pub struct BuildArgs {
    #[command(flatten)]
    at: Where,
    /// Only the base tree (what the container backend needs).
    #[arg(long, conflicts_with = "microvm")]
    base_only: bool,
    /// Only the microvm images, from the base tree already built.
    #[arg(long)]
    microvm: bool,
    /// Build again even what is current: a fresh tree from the host's apt sources picks up
    /// Debian's updates of the guests' packages. The old trees are removed, so a build that
    /// would change anything is refused while a sandbox's guest runs on svcd.toml's images
    /// (stop or destroy them first).
    #[arg(long)]
    force: bool,
}

/// `svcd images status`'s arguments.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    at: Where,
}

impl Where {
    fn layout(&self, host: &HostConfig) -> Layout {
        self.out
            .as_deref()
            .map_or_else(|| Layout::configured(host), Layout::under)
    }
}

/// Run an images command with the host configuration.
pub fn run(cmd: ImagesCommand, host: &HostConfig) -> ExitCode {
    match cmd {
        ImagesCommand::Build(args) => build(&args, host),
        ImagesCommand::Status(args) => status(&args.at, host),
    }
}

fn build(args: &BuildArgs, host: &HostConfig) -> ExitCode {
    let which = match (args.base_only, args.microvm) {
        (true, _) => Which::BaseOnly,
        (_, true) => Which::MicrovmOnly,
        _ => Which::All,
    };
    let options = images::Options {
        layout: args.at.layout(host),
        which,
        guest_bins: args.at.guest_bins.clone(),
        force: args.force,
    };
    if args.at.out.is_none()
        && let Err(e) = refuse_under_running_guests(&options, host)
    {
        eprintln!("svcd: error: {e:#}");
        return ExitCode::from(1);
    }
    let json = args.at.json;
    let mut progress = |line: &str| {
        if json {
            eprintln!("svcd images: {line}");
        } else {
            println!("svcd images: {line}");
        }
    };
    match images::build(&options, &mut progress) {
        Ok(report) => {
            if json {
                let out = serde_json::json!({ "layout": options.layout, "report": report });
                println!("{out:#}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("svcd: error: {:#}", anyhow::Error::from(e));
            ExitCode::from(1)
        }
    }
}

/// Refuse a build that would replace svcd.toml's images while guests run on them: their
/// overlays and disks read those files, and removing them breaks the running sandboxes.
fn refuse_under_running_guests(options: &images::Options, host: &HostConfig) -> anyhow::Result<()> {
    let now = images::status(&options.layout, &options.guest_bins);
    let changes = options.force
        || match options.which {
            Which::BaseOnly => !now.base.current,
            Which::MicrovmOnly => !now.microvm.current,
            Which::All => !now.base.current || !now.microvm.current,
        };
    if !changes {
        return Ok(());
    }
    let running = crate::stop_sandboxes::running_guests(host)?;
    if running.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "{} sandbox guest(s) run on these images ({}): a build now would replace the files \
         under them; destroy them (`svc sandbox destroy NAME`) or stop svcd and run \
         `svcd stop-sandboxes` first",
        running.len(),
        running.join(", ")
    )
}

fn status(at: &Where, host: &HostConfig) -> ExitCode {
    let status = images::status(&at.layout(host), &at.guest_bins);
    if at.json {
        println!("{:#}", serde_json::json!(status));
        return ExitCode::SUCCESS;
    }
    for (name, image) in [("base", &status.base), ("microvm", &status.microvm)] {
        let paths: Vec<String> = image
            .paths
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let state = if image.current {
            "current".to_owned()
        } else if image.present {
            format!("out of date: {}", image.why)
        } else {
            image.why.clone()
        };
        println!("{name}: {state}");
        println!("  {}", paths.join(", "));
        for line in &image.stamp {
            println!("  stamp {line}");
        }
    }
    println!("guest binaries: {}", status.guest_bins.display());
    ExitCode::SUCCESS
}
