//! What the user asks for, whatever key or click said it. The app never sees key codes.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Up,
    Down,
    PageUp,
    PageDown,
    HalfPageUp,
    HalfPageDown,
    First,
    Last,
    /// Open the selected group, or go to its first child.
    Expand,
    /// Close the selected group, or go to its parent.
    Collapse,
    Toggle,
    ExpandAll,
    CollapseAll,
    /// Switch between the tree and the findings list.
    FocusNext,
    /// In the findings list: select the finding's tensor in the tree.
    JumpToFinding,
    /// The next and previous tensor with findings, NaN/Inf first.
    NextProblem,
    PreviousProblem,
    CycleSeverity,
    ToggleLogHistogram,
    TogglePause,
    StartSearch,
    SearchType(char),
    SearchDelete,
    SearchAccept,
    SearchCancel,
    ShowMetadata,
    ShowHelp,
    ClosePopup,
    Quit,
}
