//! The fence's programs on links: which program each direction runs, attaching it with TCX,
//! the pinned links that keep it there, and removing a pin directory.

use std::{io, path::Path};

use aya::{
    Ebpf,
    programs::{LinkOrder, SchedClassifier, TcAttachType, links::PinnedLink, tc::TcAttachOptions},
};
use svc_ebpf_common::program;

use super::error::DataplaneError;

/// Which direction of a guest link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Guest → host (tc ingress on the host end).
    Ingress,
    /// Host → guest (tc egress on the host end).
    Egress,
}

impl Direction {
    pub(super) const fn program(self) -> &'static str {
        match self {
            Self::Ingress => program::TAP_INGRESS,
            Self::Egress => program::TAP_EGRESS,
        }
    }
    pub(super) const fn suffix(self) -> &'static str {
        match self {
            Self::Ingress => "ingress",
            Self::Egress => "egress",
        }
    }
    const fn attach_type(self) -> TcAttachType {
        match self {
            Self::Ingress => TcAttachType::Ingress,
            Self::Egress => TcAttachType::Egress,
        }
    }
}

/// Remove a pin directory made by [`Fence::load`], whoever loaded it.
pub fn remove_pin_dir(pin_dir: &Path) -> Result<(), Vec<DataplaneError>> {
    let mut errors = Vec::new();
    let links = pin_dir.join("links");
    if let Ok(entries) = std::fs::read_dir(&links) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Err(e) = detach_pinned(&name, &entry.path()) {
                errors.push(e);
            }
        }
    }
    for dir in [links.as_path(), pin_dir] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                let path = entry.path();
                if !path.is_dir()
                    && let Err(source) = std::fs::remove_file(&path)
                {
                    errors.push(DataplaneError::Unpin { path, source });
                }
            }
        }
        if let Err(source) = std::fs::remove_dir(dir)
            && source.kind() != io::ErrorKind::NotFound
        {
            errors.push(DataplaneError::Unpin {
                path: dir.to_owned(),
                source,
            });
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

pub(super) fn detach_pinned(link: &str, path: &Path) -> Result<(), DataplaneError> {
    let pinned = PinnedLink::from_pin(path).map_err(|_| DataplaneError::NotAttached {
        link: link.to_owned(),
        path: path.to_owned(),
    })?;
    // Unpinning drops the last reference once the fd closes: the kernel detaches the program.
    let fd_link = pinned.unpin().map_err(|source| DataplaneError::Detach {
        link: link.to_owned(),
        source,
    })?;
    drop(fd_link);
    Ok(())
}

pub(super) fn classifier<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut SchedClassifier, DataplaneError> {
    let prog = ebpf
        .program_mut(name)
        .ok_or(DataplaneError::MissingProgram(name))?;
    prog.try_into().map_err(|source| DataplaneError::Program {
        operation: "typing",
        program: name,
        source: Box::new(source),
    })
}

/// Attach `prog` to one direction of `link` with TCX, after whatever is there.
pub(super) fn attach_tcx(
    prog: &mut SchedClassifier,
    link: &str,
    direction: Direction,
) -> Result<aya::programs::tc::SchedClassifierLinkId, DataplaneError> {
    prog.attach_with_options(
        link,
        direction.attach_type(),
        TcAttachOptions::TcxOrder(LinkOrder::default()),
    )
    .map_err(|source| DataplaneError::Attach {
        link: link.to_owned(),
        source: Box::new(source),
    })
}

pub(super) fn link_err(link: &str, source: aya::programs::links::LinkError) -> DataplaneError {
    DataplaneError::Link {
        link: link.to_owned(),
        source: Box::new(source),
    }
}

pub(super) fn remove_if_present(path: &Path) -> Result<(), DataplaneError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(DataplaneError::Unpin {
            path: path.to_owned(),
            source,
        }),
    }
}

pub(super) fn validate_link_name(link: &str) -> Result<(), DataplaneError> {
    let ok = !link.is_empty()
        && link.len() < 16
        && !link.contains(['/', '\0'])
        && link != "."
        && link != ".."
        && !link.chars().any(char::is_whitespace);
    if ok {
        Ok(())
    } else {
        Err(DataplaneError::BadLinkName(link.to_owned()))
    }
}
