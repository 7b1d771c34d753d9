package canonical

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParsePosition(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want Position
		text string // String() of the result
	}{
		{"0/0", 0, "0/0"},
		{"0/16B3748", 0x16B3748, "0/16B3748"},
		{"16/B374D848", 0x16_B374D848, "16/B374D848"},
		{"16/b374d848", 0x16_B374D848, "16/B374D848"},
		{"00000016/0000000A", 0x16_0000000A, "16/A"},
		{"FFFFFFFF/FFFFFFFF", 1<<64 - 1, "FFFFFFFF/FFFFFFFF"},
		{"1/0", 1 << 32, "1/0"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			p, err := ParsePosition(tt.in)
			require.NoError(t, err)
			assert.Equal(t, tt.want, p)
			assert.Equal(t, tt.text, p.String())

			fast, ok := parsePositionBytes([]byte(tt.in))
			assert.True(t, ok)
			assert.Equal(t, tt.want, fast)

			appended, err := p.AppendText([]byte("at "))
			require.NoError(t, err)
			assert.Equal(t, "at "+tt.text, string(appended))
		})
	}
}

func TestParsePositionRejects(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		"", "/", "0", "0/", "/0", "16B3748", "0/16B3748/1", "123456789/0", "0/123456789",
		"G/0", "0/-1", "-1/0", "+1/0", " 0/0", "0/0 ", "0x1/0", "1_0/0", "0/1.5", "０/０",
	} {
		t.Run(in, func(t *testing.T) {
			t.Parallel()
			_, err := ParsePosition(in)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalidPosition)
			assert.Contains(t, err.Error(), "invalid position")

			_, ok := parsePositionBytes([]byte(in))
			assert.False(t, ok, "the codec's parser must agree with ParsePosition")

			var p Position
			assert.ErrorIs(t, p.UnmarshalText([]byte(in)), ErrInvalidPosition)
		})
	}
}

func TestPositionCompare(t *testing.T) {
	t.Parallel()
	a, b := Position(0x1_00000000), Position(0xFFFFFFFF)
	assert.Equal(t, 1, a.Compare(b), "the high half weighs more than any low half")
	assert.Equal(t, -1, b.Compare(a))
	assert.Equal(t, 0, a.Compare(a))
	assert.True(t, Position(0).IsZero())
	assert.False(t, a.IsZero())
}

func TestPositionMarshal(t *testing.T) {
	t.Parallel()
	type doc struct {
		At Position `json:"at"`
	}
	out, err := json.Marshal(doc{At: 0x16_B374D848})
	require.NoError(t, err)
	assert.JSONEq(t, `{"at":"16/B374D848"}`, string(out))

	var back doc
	require.NoError(t, json.Unmarshal(out, &back))
	assert.Equal(t, Position(0x16_B374D848), back.At)

	err = json.Unmarshal([]byte(`{"at":"nope"}`), &back)
	assert.True(t, errors.Is(err, ErrInvalidPosition), "got %v", err)
}

func TestAppendPositionMatchesString(t *testing.T) {
	t.Parallel()
	for _, p := range []Position{0, 1, 0xF, 0x10, 0xFFFFFFFF, 1 << 32, 0xABCDEF01_23456789, 1<<64 - 1} {
		assert.Equal(t, p.String(), string(appendPosition(nil, p)))
	}
}
