//! The terminal the explorer draws on: found, taken over, and given back as it was.

use anyhow::Context as _;
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::cursor::Show;
use ratatui::crossterm::event::{DisableMouseCapture, EnableMouseCapture};
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use std::fs::{File, OpenOptions};
use std::io::{self, IsTerminal, Write};

/// Where the explorer draws: standard output when it is a terminal, else the terminal stui runs
/// in (`/dev/tty`), so that `stui --tui PATH > file` draws on the screen and writes nothing to
/// the file.
#[derive(Debug)]
pub enum Screen {
    Stdout(io::Stdout),
    Tty(File),
}

impl Screen {
    fn open() -> io::Result<Screen> {
        let stdout = io::stdout();
        if stdout.is_terminal() {
            return Ok(Screen::Stdout(stdout));
        }
        OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/tty")
            .map(Screen::Tty)
    }
}

impl Write for Screen {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        match self {
            Screen::Stdout(stdout) => stdout.write(bytes),
            Screen::Tty(tty) => tty.write(bytes),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Screen::Stdout(stdout) => stdout.flush(),
            Screen::Tty(tty) => tty.flush(),
        }
    }
}

pub type ScreenTerminal = Terminal<CrosstermBackend<Screen>>;

/// Takes the terminal over: raw mode, the alternate screen, mouse capture. Without a terminal
/// it fails with a message saying so, having changed nothing.
pub fn take_over() -> anyhow::Result<ScreenTerminal> {
    let mut screen = Screen::open().map_err(|error| {
        anyhow::anyhow!(
            "the explorer needs a terminal and there is none (standard output is not a terminal, \
             and /dev/tty: {error}); `stui inspect PATH` prints the model's report instead"
        )
    })?;
    enable_raw_mode().context("cannot set up the terminal")?;
    let terminal = execute!(screen, EnterAlternateScreen, EnableMouseCapture)
        .and_then(|()| Terminal::new(CrosstermBackend::new(screen)));
    terminal
        .inspect_err(|_| give_back())
        .context("cannot set up the terminal")
}

/// Leaves the terminal as it was: mouse capture off, cooked mode, the main screen, the cursor
/// shown. Safe to call at any time, more than once, from a panic hook too.
pub fn give_back() {
    let mut screen = Screen::open().ok();
    if let Some(screen) = screen.as_mut() {
        let _ = execute!(screen, DisableMouseCapture);
    }
    let _ = disable_raw_mode();
    if let Some(screen) = screen.as_mut() {
        let _ = execute!(screen, LeaveAlternateScreen, Show);
    }
}
