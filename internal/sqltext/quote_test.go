package sqltext

import "testing"

func TestQuoting(t *testing.T) {
	cases := []struct{ got, want string }{
		{Ident("order"), `"order"`},
		{Ident(`we"ird`), `"we""ird"`},
		{Name("public", "Line Items"), `"public"."Line Items"`},
		{Literal("it's"), `'it''s'`},
		{Literal(`C:\dir's`), `E'C:\\dir''s'`},
		{Literal(""), `''`},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("got %s, want %s", c.got, c.want)
		}
	}
}
