"""The provider formats: conversions, recorded examples, fidelity and properties."""
