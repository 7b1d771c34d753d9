package repository

// SetBeforeManifest makes r call f before it writes a manifest generation
// (tests only).
func SetBeforeManifest(r *Repository, f func(chain string, gen int)) { r.beforeManifest = f }

// Writer returns the id r writes in its manifests (tests only).
func Writer(r *Repository) string { return r.writer }
