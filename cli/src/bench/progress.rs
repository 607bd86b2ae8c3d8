//! The run's progress on stderr, step by step.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Progress on stderr: a bar on a terminal, a line per phase otherwise.
pub(super) struct Progress {
    pub(super) bar: ProgressBar,
}

impl Progress {
    pub(super) fn new(steps: u64) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(steps), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} (eta {eta}) {msg}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        Progress { bar }
    }

    pub(super) fn phase(&self, text: &str) {
        if self.bar.is_hidden() {
            eprintln!("pgfence bench: {text}");
        }
        self.bar.set_message(text.to_owned());
    }

    pub(super) fn step(&self, text: String) {
        self.bar.set_message(text);
        self.bar.inc(1);
    }
}
