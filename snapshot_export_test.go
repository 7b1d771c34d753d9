package siphon

// What the external tests of snapshot*.go need from the inside.

// SessionSettingsForTest are the settings of every siphon session.
var SessionSettingsForTest = sessionSettings
