package siphon

import "maps"

// What the external tests of snapshot*.go need from the inside.

// SessionSettingsForTest are the settings of every siphon session that
// shape how values print (not its search_path: the tests' own SQL names
// their tables without a schema).
var SessionSettingsForTest = func() map[string]string {
	settings := maps.Clone(sessionSettings)
	delete(settings, "search_path")
	return settings
}()
