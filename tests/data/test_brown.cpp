// Brown detokenizer on hand-written lines in the corpus' own format; the
// expected strings were written by hand from the rules in brown.h.
#include <gtest/gtest.h>

#include "data/brown.h"  // beside its .cpp in src/

namespace snip::data {
namespace {

TEST(BrownTags, WordAndTagSplitAtLastSlash) {
  EXPECT_EQ(brown_word("The/at"), "The");
  EXPECT_EQ(brown_tag("The/at"), "at");
  EXPECT_EQ(brown_word("1-1/2/cd"), "1-1/2");
  EXPECT_EQ(brown_tag("1-1/2/cd"), "cd");
  EXPECT_EQ(brown_word("//in"), "/");
  EXPECT_EQ(brown_word("Atlanta's/np$"), "Atlanta's");
  EXPECT_EQ(brown_word("plain"), "plain");
  EXPECT_EQ(brown_tag("plain"), "");
}

TEST(BrownDetokenize, FirstSentenceOfCa01) {
  const char* line =
      "\tThe/at Fulton/np-tl County/nn-tl Grand/jj-tl Jury/nn-tl said/vbd Friday/nr an/at investigation/nn of/in "
      "Atlanta's/np$ recent/jj primary/nn election/nn produced/vbd ``/`` no/at evidence/nn ''/'' that/cs any/dti "
      "irregularities/nns took/vbd place/nn ./.\n";
  EXPECT_EQ(detokenize_brown(line),
            "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary election produced "
            "\"no evidence\" that any irregularities took place.");
}

TEST(BrownDetokenize, QuotesThenComma) {
  const char* line =
      "\t``/`` Only/rb a/at relative/jj handful/nn of/in such/jj reports/nns was/bedz received/vbn ''/'' ,/, the/at "
      "jury/nn said/vbd ,/, ``/`` considering/in the/at widespread/jj interest/nn ''/'' ./.";
  EXPECT_EQ(detokenize_brown(line),
            "\"Only a relative handful of such reports was received\", the jury said, \"considering the widespread "
            "interest\".");
}

TEST(BrownDetokenize, BracketsParensSemicolonContraction) {
  EXPECT_EQ(detokenize_brown("I/ppss understand/vb [/( Hearst/np ]/) (/( 1960/cd )/) ;/. he/pps didn't/dod* go/vb ?/."),
            "I understand [Hearst] (1960); he didn't go?");
}

TEST(BrownDetokenize, SingleQuotesNestedInDoubleQuotes) {
  EXPECT_EQ(detokenize_brown("``/`` It's/pps+bez '/' See/vb Joe/np ,/, see/vb Jim/np '/' ''/'' ,/, he/pps said/vbd ./."),
            "\"It's 'See Joe, see Jim'\", he said.");
  EXPECT_EQ(detokenize_brown("the/at '/' Met/np '/' is/bez back/rb !/."), "the 'Met' is back!");
}

TEST(BrownDetokenize, SlashesInsideWordsAndDashes) {
  EXPECT_EQ(detokenize_brown("1-1/2/cd inches/nns and/or/cc 3/4/cd ;/. men/nns --/-- who/wps wore/vbd :/: brown/jj"),
            "1-1/2 inches and/or 3/4; men -- who wore: brown");
}

TEST(BrownDetokenize, ParagraphsAndHeadlines) {
  const char* file =
      "\n\n"
      "Thirty-three/cd-hl \n"
      "Scotty/np did/dod not/* go/vb back/rb ./.\n"
      "His/pp$ parents/nns talked/vbd ./.\n"
      "\n\n"
      "\tScotty/np accepted/vbd ./.\n"
      "\n\n"
      "Merger/nn-hl proposed/vbn-hl \n"
      "\n"
      "However/wrb ,/, the/at jury/nn said/vbd so/rb ./.\n";
  EXPECT_EQ(detokenize_brown(file),
            "Thirty-three\n"
            "Scotty did not go back. His parents talked.\n"
            "Scotty accepted.\n"
            "Merger proposed\n"
            "However, the jury said so.");
}

TEST(BrownDetokenize, TabStartsNewParagraphEvenWithoutBlankLine) {
  EXPECT_EQ(detokenize_brown("\tOne/cd ./.\n\tTwo/cd ./.\n"), "One.\nTwo.");
}

TEST(BrownDetokenize, AbbreviationAtSentenceEndAndDoubledSemicolon) {
  EXPECT_EQ(detokenize_brown("won/vbn by/in Ivan/np Allen/np Jr./np ./. Then/rb ;/. ;/. so/rb etc./rb ./."),
            "won by Ivan Allen Jr. Then; so etc.");
  EXPECT_EQ(detokenize_brown("what/wdt ?/. ./."), "what?.");  // only a word ending in '.' absorbs the period
}

TEST(BrownDetokenize, EmptyInput) {
  EXPECT_EQ(detokenize_brown(""), "");
  EXPECT_EQ(detokenize_brown("\n\n\t \n"), "");
}

TEST(Detokenize, PtbStyleSplitContractionsAndCurrency) {
  const std::vector<std::string_view> w = {"I", "do", "n't", "know", "what", "he", "'s", "doing", "with", "$",
                                           "5", "(", "or", "#", "3", ")", "..."};
  EXPECT_EQ(detokenize(w), "I don't know what he's doing with $5 (or #3)...");
}

TEST(Detokenize, SingleQuoteStateIsPerCall) {
  // Each call (= paragraph) starts with the quote closed.
  EXPECT_EQ(detokenize({"'", "a", "'"}), "'a'");
  EXPECT_EQ(detokenize({"'", "b"}), "'b");
  EXPECT_EQ(detokenize({"x", "'", "c", "'", "!"}), "x 'c'!");
}

}  // namespace
}  // namespace snip::data
