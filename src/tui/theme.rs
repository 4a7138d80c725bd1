//! The only place colours appear: semantic styles, in the 16 named ANSI colours (safe over SSH
//! and in any terminal theme), or monochrome with bold, reverse and symbols for `NO_COLOR`.

use ratatui::style::{Color, Modifier, Style};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Theme {
    pub colored: bool,
    pub base: Style,
    pub dim: Style,
    pub title: Style,
    pub border: Style,
    pub border_focused: Style,
    pub selected: Style,
    pub error: Style,
    pub warning: Style,
    pub info: Style,
    pub good: Style,
    pub bar: Style,
    pub key: Style,
    pub matched: Style,
    /// The layer map's shades, low to high: colours that keep their order in monochrome.
    pub ramp: [Style; 4],
    /// A layer map cell far from its row.
    pub outlier: Style,
    /// A layer map cell holding NaN or Inf, or unreadable.
    pub broken: Style,
    /// The layer map's cursor.
    pub cursor: Style,
}

impl Theme {
    pub fn new(colored: bool) -> Theme {
        if colored {
            Theme {
                colored,
                base: Style::new(),
                dim: Style::new().fg(Color::DarkGray),
                title: Style::new().add_modifier(Modifier::BOLD),
                border: Style::new().fg(Color::DarkGray),
                border_focused: Style::new().fg(Color::Cyan),
                selected: Style::new().add_modifier(Modifier::REVERSED),
                error: Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
                warning: Style::new().fg(Color::Yellow),
                info: Style::new().fg(Color::Blue),
                good: Style::new().fg(Color::Green),
                bar: Style::new().fg(Color::Cyan),
                key: Style::new().fg(Color::Cyan).add_modifier(Modifier::BOLD),
                matched: Style::new().fg(Color::Magenta).add_modifier(Modifier::BOLD),
                ramp: [
                    Style::new().fg(Color::Blue),
                    Style::new().fg(Color::Cyan),
                    Style::new().fg(Color::Green),
                    Style::new().fg(Color::Yellow),
                ],
                outlier: Style::new().fg(Color::Magenta).add_modifier(Modifier::BOLD),
                broken: Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
                cursor: Style::new().add_modifier(Modifier::REVERSED),
            }
        } else {
            let bold = Style::new().add_modifier(Modifier::BOLD);
            Theme {
                colored,
                base: Style::new(),
                dim: Style::new(),
                title: bold,
                border: Style::new(),
                border_focused: bold,
                selected: Style::new().add_modifier(Modifier::REVERSED),
                error: bold,
                warning: bold,
                info: Style::new(),
                good: Style::new(),
                bar: Style::new(),
                key: bold,
                matched: Style::new().add_modifier(Modifier::UNDERLINED),
                ramp: [Style::new(); 4],
                outlier: Style::new().add_modifier(Modifier::REVERSED),
                broken: bold.add_modifier(Modifier::REVERSED),
                cursor: bold.add_modifier(Modifier::UNDERLINED),
            }
        }
    }
}
