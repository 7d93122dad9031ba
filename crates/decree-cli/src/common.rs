//! What the subcommands share: output format, progress bar, the working directory.

use std::io::IsTerminal;
use std::path::PathBuf;

/// The boxed error every subcommand returns; `main` prints it.
pub type CliResult = Result<(), Box<dyn std::error::Error>>;

/// How results are printed on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns for people.
    Table,
    /// One JSON object per line for scripts.
    Json,
}

/// A progress bar on stderr when it is a terminal, hidden otherwise (pipes, CI, tests).
pub fn progress_bar(length: Option<u64>) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = match length {
        Some(n) => indicatif::ProgressBar::new(n),
        None => indicatif::ProgressBar::new_spinner(),
    };
    let template = if length.is_some() {
        "{elapsed_precise} [{bar:30}] {pos}/{len} {msg}"
    } else {
        "{elapsed_precise} {spinner} {pos} {msg}"
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}

/// The parent of a benchmark's per-run directories: the one given, kept afterwards, or a
/// temporary one in the current directory (so on the disk to measure, not on a tmpfs
/// `/tmp`), removed when this value is dropped.
pub enum WorkDir {
    /// Given by `--dir`: created if missing, never removed.
    Given(PathBuf),
    /// Created here, removed on drop.
    Temporary(tempfile::TempDir),
}

impl WorkDir {
    /// The directory from `--dir`, or a new temporary one named `.{prefix}-XXXX` in `.`.
    pub fn new(given: Option<PathBuf>, prefix: &str) -> Result<Self, Box<dyn std::error::Error>> {
        match given {
            Some(dir) => {
                std::fs::create_dir_all(&dir)
                    .map_err(|e| format!("cannot create directory {}: {e}", dir.display()))?;
                Ok(WorkDir::Given(dir))
            }
            None => {
                let dir =
                    tempfile::Builder::new().prefix(&format!(".{prefix}-")).tempdir_in(".").map_err(|e| {
                        format!("cannot create a temporary directory in the current directory: {e}")
                    })?;
                Ok(WorkDir::Temporary(dir))
            }
        }
    }

    /// The path.
    pub fn path(&self) -> PathBuf {
        match self {
            WorkDir::Given(p) => p.clone(),
            WorkDir::Temporary(t) => t.path().to_path_buf(),
        }
    }
}
