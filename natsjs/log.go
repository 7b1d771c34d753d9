package natsjs

import (
	"context"
	"log/slog"
)

// warnAndAbove is the default log handler, as siphon's: warnings and
// errors go to slog.Default, the rest is dropped.
type warnAndAbove struct{ attrs []slog.Attr }

func (warnAndAbove) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h warnAndAbove) Handle(ctx context.Context, r slog.Record) error {
	r.AddAttrs(h.attrs...)
	return slog.Default().Handler().Handle(ctx, r)
}

func (h warnAndAbove) WithAttrs(attrs []slog.Attr) slog.Handler {
	return warnAndAbove{attrs: append(append([]slog.Attr(nil), h.attrs...), attrs...)}
}

func (h warnAndAbove) WithGroup(string) slog.Handler { return h }
