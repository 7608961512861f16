//! The pieces of cuSOLVER the spec leaves to the guest: none (the generated trait is empty).

use super::stubs::HandWritten;

/// The implementation of [`HandWritten`].
pub struct Hand;

impl HandWritten for Hand {}
