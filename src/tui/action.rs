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
    /// Open the quantize dialog for the selection.
    Quantize,
    QuantizeGranularity,
    /// Quantize the whole model rather than the selection.
    QuantizeWholeModel,
    QuantizeSkipNonFinite,
    /// The next scheme.
    QuantizeScheme,
    /// The next SNR threshold below which weights stay in source precision (or none).
    QuantizeKeepBelow,
    /// Save (or confirm replacing the output).
    QuantizeConfirm,
    /// Cancel a save under way, or close the dialog.
    QuantizeCancel,
    /// After saving: open the new file in place.
    OpenResult,
    ClosePopup,
    /// Open the layer map, or go back from it to the tree.
    ToggleMap,
    /// List a quantized model's tensors as stored, or by the weights they encode.
    ToggleRaw,
    /// In the layer map: the cursor a column left or right.
    Left,
    Right,
    /// In the layer map: the next measure the cells show.
    MapMeasure,
    /// In the layer map: a row per expert, or each kind's experts folded into one row.
    MapExperts,
    /// In the layer map: select the tensor under the cursor in the tree.
    MapJump,
    Quit,
    /// Esc in the tree: stops the download of the selected tensor of a model read from the
    /// Hub when one is under way; quits otherwise.
    Escape,
}
